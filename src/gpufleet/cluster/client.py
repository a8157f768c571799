"""``gpufleet submit | status | logs | cancel``: the official kubernetes client, injected.

``Cluster.connect()`` loads a kubeconfig (``KUBECONFIG``, ``~/.kube/config``) or the in-cluster
service account; tests build ``Cluster(custom, core)`` from objects that serve recorded API
responses. Everything it fetches goes through ``status.summarize`` (pure, unit-tested).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpufleet.cluster.status import JobStatus, summarize, summarize_service
from gpufleet.errors import FieldError, GpufleetError, UserInputError
from gpufleet.kube import LABEL_JOB, LABEL_ROLE, ROLE_SERVER, Obj, job_selector


@dataclass(frozen=True)
class Kind:
    """A job kind gpufleet renders: where its objects live in the API."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


# Top-level job kinds, in the order ``status`` looks for a job of a given name.
JOB_KINDS = [
    Kind("batch", "v1", "jobs", "Job"),
    Kind("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"),
    Kind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    Kind("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    Kind("kubeflow.org", "v2beta1", "mpijobs", "MPIJob"),
    Kind("batch.volcano.sh", "v1alpha1", "jobs", "Job"),
]
WORKLOADS = Kind("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
LOCAL_QUEUES = Kind("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue")
CLUSTER_QUEUES = Kind("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue")
PODGROUPS = Kind("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
# Rendered next to a job when spec.metrics.podMonitor is set (Prometheus Operator).
PODMONITORS = Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
# Serving (kind InferenceService): custom kinds, and built-in kinds with their typed client call.
SERVING_KINDS = [
    Kind("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject"),
    Kind("serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService"),
]
# Built-in serving kinds, in the order the renderer emits them: (apiVersion, kind) -> the typed
# API class and its method suffix (create_<suffix>, delete_<suffix>). Service goes through core.
BUILTIN_KINDS = {
    ("apps/v1", "Deployment"): ("AppsV1Api", "namespaced_deployment"),
    ("v1", "Service"): ("CoreV1Api", "namespaced_service"),
    ("policy/v1", "PodDisruptionBudget"): ("PolicyV1Api", "namespaced_pod_disruption_budget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): (
        "AutoscalingV2Api",
        "namespaced_horizontal_pod_autoscaler",
    ),
}


class ClusterError(GpufleetError):
    """The cluster said no (forbidden, conflict, unreachable): exit 1 with its words."""


def _kind_of(obj: Obj) -> Kind:
    for kind in [*JOB_KINDS, PODMONITORS, *SERVING_KINDS]:
        if kind.api_version == obj["apiVersion"] and kind.kind == obj["kind"]:
            return kind
    raise ValueError(f"not a gpufleet kind: {obj['apiVersion']} {obj['kind']}")


def _status_code(exc: Exception) -> int | None:
    return getattr(exc, "status", None)


class Cluster:
    """Submit, inspect and cancel gpufleet jobs in one namespace's worth of API calls."""

    def __init__(
        self, custom: Any, core: Any, namespace: str = "default", apis: dict[str, Any] | None = None
    ) -> None:
        self.custom = custom  # kubernetes.client.CustomObjectsApi (or a stand-in)
        self.core = core  # kubernetes.client.CoreV1Api
        self.namespace = namespace
        # The typed APIs of BUILTIN_KINDS by class name (serving objects); core is CoreV1Api.
        self.apis = {"CoreV1Api": core, **(apis or {})}

    @classmethod
    def connect(cls, namespace: str | None = None, context: str | None = None) -> Cluster:
        """Load a kubeconfig (or the in-cluster account); exit 2 saying how if there is none."""
        try:
            from kubernetes import client, config
            from kubernetes.config.config_exception import ConfigException
        except ImportError as exc:
            raise UserInputError(
                [
                    FieldError(
                        "kubernetes", "the cluster commands need: pip install 'gpufleet[cluster]'"
                    )
                ]
            ) from exc
        try:
            config.load_kube_config(context=context)
            _, active = config.list_kube_config_contexts()
            default_ns = (active or {}).get("context", {}).get("namespace") or "default"
        except (ConfigException, OSError, TypeError):
            try:
                config.load_incluster_config()
            except ConfigException as exc:
                raise UserInputError(
                    [
                        FieldError(
                            "KUBECONFIG",
                            "no kubeconfig found (set KUBECONFIG or create "
                            "~/.kube/config) and not running in a cluster",
                        )
                    ]
                ) from exc
            default_ns = _incluster_namespace()
        apis = {n: getattr(client, n)() for n, _ in BUILTIN_KINDS.values() if n != "CoreV1Api"}
        return cls(client.CustomObjectsApi(), client.CoreV1Api(), namespace or default_ns, apis)

    # -- submit ----------------------------------------------------------------------------

    def submit(self, objects: list[Obj]) -> list[str]:
        """Create ``objects`` (rendered) in order; return ``kind/name`` of each."""
        created = []
        for obj in objects:
            ns = obj["metadata"].get("namespace", self.namespace)
            obj = {**obj, "metadata": {**obj["metadata"], "namespace": ns}}
            try:
                builtin = BUILTIN_KINDS.get((obj["apiVersion"], obj["kind"]))
                if builtin is not None:
                    api, suffix = builtin
                    getattr(self.apis[api], f"create_{suffix}")(ns, obj)
                else:
                    k = _kind_of(obj)
                    self.custom.create_namespaced_custom_object(
                        k.group, k.version, ns, k.plural, obj
                    )
            except Exception as exc:
                raise self._api_error(
                    exc, f"create {obj['kind']} {ns}/{obj['metadata']['name']}"
                ) from exc
            created.append(f"{obj['kind']}/{obj['metadata']['name']}")
        return created

    # -- status ----------------------------------------------------------------------------

    def find(self, name: str) -> tuple[Kind, Obj] | None:
        """The job object named ``name`` (any gpufleet kind); None if there is none."""
        for kind in JOB_KINDS:
            obj = self._get(kind, name)
            if obj is not None and _is_ours(obj, name):
                return kind, obj
        return None

    def service(self, name: str) -> Obj | None:
        """The Triton Deployment of an InferenceService named ``name``; None if there is none."""
        apps = self.apis.get("AppsV1Api")
        if apps is None:
            return None
        try:
            found = _as_dict(apps.read_namespaced_deployment(name, self.namespace))
        except Exception as exc:
            if _status_code(exc) == 404:
                return None
            raise self._api_error(exc, f"read Deployment {name}") from exc
        labels = found["metadata"].get("labels") or {}
        ours = labels.get(LABEL_JOB) == name and labels.get(LABEL_ROLE) == ROLE_SERVER
        return found if ours else None

    def status(self, name: str) -> JobStatus:
        """The job's (or service's) status line and the reasons it is not running."""
        found = self.find(name)
        if found is None:
            deployment = self.service(name)
            if deployment is not None:
                pods = self.pods(name)
                return summarize_service(deployment, pods, self._pending_events(pods))
            raise UserInputError(
                [FieldError("NAME", f"no gpufleet job {name!r} in namespace {self.namespace}")]
            )
        kind, job = found
        pods = self.pods(name)
        events = self._pending_events(pods)
        workload = self._owned_by(WORKLOADS, job)
        local_queue = cluster_queue = None
        if workload is not None:
            local_queue = self._get(LOCAL_QUEUES, workload["spec"].get("queueName", ""))
            cq = ((local_queue or {}).get("spec") or {}).get("clusterQueue")
            cluster_queue = self._get(CLUSTER_QUEUES, cq, cluster_scoped=True) if cq else None
        podgroup = self._owned_by(PODGROUPS, job) if kind.group == "batch.volcano.sh" else None
        return summarize(
            job,
            pods,
            events,
            workload=workload,
            local_queue=local_queue,
            cluster_queue=cluster_queue,
            podgroup=podgroup,
        )

    def pods(self, name: str) -> list[Obj]:
        """The job's pods (label gpufleet.dev/job), as API dicts sorted by name."""
        try:
            found = self.core.list_namespaced_pod(self.namespace, label_selector=job_selector(name))
        except Exception as exc:
            raise self._api_error(exc, f"list pods of {name}") from exc
        return sorted((_as_dict(p) for p in _items(found)), key=lambda p: p["metadata"]["name"])

    # -- logs and cancel --------------------------------------------------------------------

    def logs(self, name: str, *, tail: int | None = None, pod: str | None = None) -> Iterator[str]:
        """Each pod's log lines, prefixed ``[pod]``; one pod with ``pod``."""
        pods = [p["metadata"]["name"] for p in self.pods(name)]
        if pod is not None:
            if pod not in pods:
                raise UserInputError([FieldError("--pod", f"{pod} is not a pod of {name}: {pods}")])
            pods = [pod]
        for p in pods:
            try:
                text = self.core.read_namespaced_pod_log(p, self.namespace, tail_lines=tail)
            except Exception as exc:
                if _status_code(exc) == 400:  # not started yet
                    yield f"[{p}] (no log yet: {getattr(exc, 'body', exc)})"
                    continue
                raise self._api_error(exc, f"read log of pod {p}") from exc
            for line in str(text).splitlines():
                yield f"[{p}] {line}"

    def cancel(self, name: str) -> list[str]:
        """Delete the job (its pods go with it) and its rendezvous Service, if any; or an
        InferenceService's objects."""
        found = self.find(name)
        if found is None:
            deleted = self._delete_service(name)
            if deleted:
                return deleted
            raise UserInputError(
                [FieldError("NAME", f"no gpufleet job {name!r} in namespace {self.namespace}")]
            )
        kind, _ = found
        body = {"propagationPolicy": "Foreground"}
        deleted = []
        try:
            self.custom.delete_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, name, body=body
            )
            deleted.append(f"{kind.kind}/{name}")
            services = self.core.list_namespaced_service(
                self.namespace, label_selector=job_selector(name)
            )
            for svc in (_as_dict(s) for s in _items(services)):
                self.core.delete_namespaced_service(svc["metadata"]["name"], self.namespace)
                deleted.append(f"Service/{svc['metadata']['name']}")
            deleted += self._delete_pod_monitors(name)
        except Exception as exc:
            raise self._api_error(exc, f"delete {kind.kind} {name}") from exc
        return deleted

    def _delete_service(self, name: str) -> list[str]:
        """Delete what an InferenceService rendered (any target); what is absent is skipped."""
        if self.service(name) is None and not any(
            self._get(k, name) is not None for k in SERVING_KINDS
        ):
            return []
        ns = self.namespace
        # The reverse of the render order (the autoscaler before what it scales), then custom kinds.
        calls: list[tuple[str, Any]] = [
            (kind, lambda a=api, m=suffix: getattr(self.apis[a], f"delete_{m}")(name, ns))
            for (_, kind), (api, suffix) in reversed(BUILTIN_KINDS.items())
        ] + [
            (
                k.kind,
                lambda k=k: self.custom.delete_namespaced_custom_object(
                    k.group, k.version, ns, k.plural, name
                ),
            )
            for k in SERVING_KINDS
        ]
        deleted = []
        for kind, call in calls:
            try:
                call()
            except Exception as exc:
                if _status_code(exc) == 404:
                    continue
                raise self._api_error(exc, f"delete {kind} {name}") from exc
            deleted.append(f"{kind}/{name}")
        return deleted

    def _delete_pod_monitors(self, name: str) -> list[str]:
        """Delete the job's PodMonitor, if it has one (no Prometheus Operator: nothing to do)."""
        k = PODMONITORS
        try:
            listed = self.custom.list_namespaced_custom_object(
                k.group, k.version, self.namespace, k.plural, label_selector=job_selector(name)
            )
        except Exception as exc:
            if _status_code(exc) == 404:  # the CRD is not installed
                return []
            raise
        deleted = []
        for monitor in listed.get("items", []):
            self.custom.delete_namespaced_custom_object(
                k.group, k.version, self.namespace, k.plural, monitor["metadata"]["name"]
            )
            deleted.append(f"PodMonitor/{monitor['metadata']['name']}")
        return deleted

    # -- helpers ----------------------------------------------------------------------------

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
        except Exception as exc:
            if _status_code(exc) == 404:  # no such object, or the CRD is not installed
                return None
            raise self._api_error(exc, f"get {kind.kind} {name}") from exc
        return _as_dict(obj)

    def _owned_by(self, kind: Kind, owner: Obj) -> Obj | None:
        uid = owner["metadata"].get("uid")
        try:
            listed = self.custom.list_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural
            )
        except Exception as exc:
            if _status_code(exc) == 404:
                return None
            raise self._api_error(exc, f"list {kind.plural}") from exc
        for item in _items(listed):
            refs = item["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                return _as_dict(item)
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
        except Exception as exc:
            raise self._api_error(exc, f"list events of pod {pod}") from exc
        return [_as_dict(e) for e in _items(found)]

    def _api_error(self, exc: Exception, doing: str) -> GpufleetError:
        code = _status_code(exc)
        if code is None:
            return ClusterError(f"{doing}: {exc}")
        reason = {
            403: "forbidden (RBAC)",
            404: "not found (is the operator's CRD installed?)",
            409: "already exists (gpufleet cancel it first)",
            422: "rejected as invalid",
        }
        body = getattr(exc, "body", "") or ""
        return ClusterError(f"{doing}: {reason.get(code, f'HTTP {code}')}: {str(body)[:500]}")


def _is_ours(obj: Obj, name: str) -> bool:
    return (obj["metadata"].get("labels") or {}).get(LABEL_JOB) == name


def _items(listed: Any) -> list[Any]:
    if isinstance(listed, dict):
        return list(listed.get("items") or [])
    return list(getattr(listed, "items", None) or [])


def _as_dict(obj: Any) -> Obj:
    """Typed client models (V1Pod, ...) as the API's camelCase dicts; dicts pass through."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    result: Obj = ApiClient().sanitize_for_serialization(obj)
    return result


def _incluster_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path) as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"
