"""The cluster operations on an InferenceService (what ``render.serving`` wrote: the Triton
Deployment, its Service and autoscaler, or KServe's objects): find it, fold its status, delete
it. Mixed into ``Cluster``, whose ``status`` and ``cancel`` fall back to them for a name that
is no job."""

from __future__ import annotations

from typing import Any

from gpufleet.cluster.access import ApiAccess, as_dict
from gpufleet.cluster.apierrors import api_errors, status_code, to_cluster_error
from gpufleet.cluster.kinds import BUILTIN_KINDS, SERVING_KINDS
from gpufleet.cluster.status import JobStatus, summarize_service
from gpufleet.kube import LABEL_JOB, LABEL_ROLE, ROLE_SERVER, Obj


class ServingOperations(ApiAccess):
    """Find, summarize and delete InferenceServices."""

    def service(self, name: str) -> Obj | None:
        """The Triton Deployment of an InferenceService named ``name``; None if there is none."""
        apps = self.apis.get("AppsV1Api")
        if apps is None:
            return None
        try:
            found = as_dict(apps.read_namespaced_deployment(name, self.namespace))
        except api_errors() as exc:
            if status_code(exc) == 404:
                return None
            raise to_cluster_error(exc, f"read Deployment {name}") from exc
        labels = found["metadata"].get("labels") or {}
        ours = labels.get(LABEL_JOB) == name and labels.get(LABEL_ROLE) == ROLE_SERVER
        return found if ours else None

    def service_status(self, name: str) -> JobStatus | None:
        """The InferenceService's status line and the reasons its pods wait; None if there is
        no such service."""
        deployment = self.service(name)
        if deployment is None:
            return None
        pods = self.pods(name)
        return summarize_service(deployment, pods, self._pending_events(pods))

    def delete_service(self, name: str) -> list[str]:
        """Delete what an InferenceService rendered (any target); what is absent is skipped."""
        if self.service(name) is None and not any(
            self._get(k, name) is not None for k in SERVING_KINDS
        ):
            return []
        deleted = []
        for kind, call in self._deletions(name):
            try:
                call()
            except api_errors() as exc:
                if status_code(exc) == 404:
                    continue
                raise to_cluster_error(exc, f"delete {kind} {name}") from exc
            deleted.append(f"{kind}/{name}")
        return deleted

    def _deletions(self, name: str) -> list[tuple[str, Any]]:
        """The reverse of the render order (the autoscaler before what it scales), then the
        custom kinds."""
        ns = self.namespace
        calls: list[tuple[str, Any]] = [
            (kind, lambda a=api, m=suffix: getattr(self.apis[a], f"delete_{m}")(name, ns))
            for (_, kind), (api, suffix) in reversed(BUILTIN_KINDS.items())
        ]
        calls += [
            (k.kind, lambda k=k: self.custom.delete_namespaced_custom_object(
                k.group, k.version, ns, k.plural, name))
            for k in SERVING_KINDS
        ]  # fmt: skip
        return calls
