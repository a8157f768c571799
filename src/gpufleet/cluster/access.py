"""Reading a namespace's objects through the injected kubernetes client: what the job and the
serving operations share (a 404 is "none", any other refusal a ClusterError)."""

from __future__ import annotations

from typing import Any

from gpufleet.cluster.apierrors import api_errors, status_code, to_cluster_error
from gpufleet.cluster.kinds import Kind
from gpufleet.kube import LABEL_JOB, Obj, job_selector


def is_ours(obj: Obj, name: str) -> bool:
    """Whether gpufleet labelled ``obj`` as part of job (or service) ``name``."""
    return (obj["metadata"].get("labels") or {}).get(LABEL_JOB) == name


def items(listed: Any) -> list[Any]:
    """The items of a list response (a typed model or a custom objects dict)."""
    if isinstance(listed, dict):
        return list(listed.get("items") or [])
    return list(getattr(listed, "items", None) or [])


def as_dict(obj: Any) -> Obj:
    """Typed client models (V1Pod, ...) as the API's camelCase dicts; dicts pass through."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    result: Obj = ApiClient().sanitize_for_serialization(obj)
    return result


class ApiAccess:
    """The APIs of one namespace: custom objects, core, and the typed APIs by class name."""

    def __init__(
        self, custom: Any, core: Any, namespace: str = "default", apis: dict[str, Any] | None = None
    ) -> None:
        self.custom = custom  # kubernetes.client.CustomObjectsApi (or a stand-in)
        self.core = core  # kubernetes.client.CoreV1Api
        self.namespace = namespace
        # The typed APIs of BUILTIN_KINDS by class name (serving objects); core is CoreV1Api.
        self.apis = {"CoreV1Api": core, **(apis or {})}

    def pods(self, name: str) -> list[Obj]:
        """The job's pods (label gpufleet.dev/job), as API dicts sorted by name."""
        try:
            found = self.core.list_namespaced_pod(self.namespace, label_selector=job_selector(name))
        except api_errors() as exc:
            raise to_cluster_error(exc, f"list pods of {name}") from exc
        return sorted((as_dict(p) for p in items(found)), key=lambda p: p["metadata"]["name"])

    def _get(self, kind: Kind, name: str, *, cluster_scoped: bool = False) -> Obj | None:
        try:
            if cluster_scoped:
                obj = self.custom.get_cluster_custom_object(
                    kind.group, kind.version, kind.plural, name
                )
            else:
                obj = self.custom.get_namespaced_custom_object(
                    kind.group, kind.version, self.namespace, kind.plural, name
                )
        except api_errors() as exc:
            if status_code(exc) == 404:  # no such object, or the CRD is not installed
                return None
            raise to_cluster_error(exc, f"get {kind.kind} {name}") from exc
        return as_dict(obj)

    def owned_by(self, kind: Kind, owner: Obj) -> Obj | None:
        """The object of ``kind`` in the namespace that ``owner`` owns (its Workload, say)."""
        uid = owner["metadata"].get("uid")
        try:
            listed = self.custom.list_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural
            )
        except api_errors() as exc:
            if status_code(exc) == 404:
                return None
            raise to_cluster_error(exc, f"list {kind.plural}") from exc
        for item in items(listed):
            refs = item["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                return as_dict(item)
        return None

    def _pending_events(self, pods: list[Obj]) -> list[Obj]:
        """The events of the pods still Pending (the scheduler's reasons)."""
        return [
            e
            for p in pods
            if (p.get("status") or {}).get("phase") == "Pending"
            for e in self._list_events(p["metadata"]["name"])
        ]

    def _list_events(self, pod: str) -> list[Obj]:
        try:
            found = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}"
            )
        except api_errors() as exc:
            raise to_cluster_error(exc, f"list events of pod {pod}") from exc
        return [as_dict(e) for e in items(found)]
