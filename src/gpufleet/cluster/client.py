"""``gpufleet submit | status | logs | cancel``: the official kubernetes client, injected.

``Cluster.connect()`` loads a kubeconfig (``KUBECONFIG``, ``~/.kube/config``) or the in-cluster
service account; tests inject one stand-in for every API (tests/fake_kube.py) holding recorded
objects. Everything it fetches goes through ``status.summarize`` (pure, unit-tested). Only the
client's own errors (``api_errors()``) become ClusterError; anything else is a bug of ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

from gpufleet.cluster.kinds import (
    BUILTIN_KINDS,
    CLUSTER_QUEUES,
    JOB_KINDS,
    LOCAL_QUEUES,
    PODGROUPS,
    PODMONITORS,
    SERVING_KINDS,
    WORKLOADS,
    Kind,
    kind_of,
)
from gpufleet.cluster.status import FAILED_CREATE_REASONS, JobStatus, summarize, summarize_service
from gpufleet.errors import FieldError, GpufleetError, UserInputError
from gpufleet.kube import (
    KUEUE_QUEUE_LABEL,
    LABEL_JOB,
    LABEL_ROLE,
    ROLE_SERVER,
    Obj,
    job_selector,
)


class ClusterError(GpufleetError):
    """The cluster said no (forbidden, conflict, unreachable): exit 1 with its words."""


@cache
def api_errors() -> tuple[type[Exception], ...]:
    """What the kubernetes client raises when the cluster says no or cannot be reached: its
    ApiException (with the HTTP status) and urllib3's transport errors. Anything else is a bug
    of ours and propagates with its traceback instead of posing as a cluster error."""
    try:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError
    except ImportError:  # no client installed: nothing can raise its errors
        return ()
    return (ApiException, HTTPError)


def _status_code(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)  # ApiException's HTTP status; None for transport
    return status if isinstance(status, int) else None


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
        return cls.of(client.ApiClient(), namespace or default_ns)

    @classmethod
    def of(cls, api_client: Any, namespace: str) -> Cluster:
        """The Cluster whose API calls go through ``api_client`` (a kubernetes.client.ApiClient)."""
        from kubernetes import client

        apis = {n: getattr(client, n)(api_client) for n, _ in BUILTIN_KINDS.values()
                if n != "CoreV1Api"}  # fmt: skip
        custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        return cls(custom, core, namespace, apis)

    # -- submit ----------------------------------------------------------------------------

    def submit(self, objects: list[Obj]) -> list[str]:
        """Create ``objects`` (rendered) in order; return ``kind/name`` of each.

        Every create uses strict field validation. A queued job's LocalQueue is checked first
        (exit 2 if Kueue or the queue is missing: the job would wait, suspended, forever). When
        the API server refuses an object, those created before it are deleted again, so nothing
        is left half-applied."""
        objects = [
            {**o, "metadata": {**o["metadata"],
                               "namespace": o["metadata"].get("namespace", self.namespace)}}
            for o in objects
        ]  # fmt: skip
        self._check_queues(objects)
        created: list[Obj] = []
        for obj in objects:
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            try:
                builtin = BUILTIN_KINDS.get((obj["apiVersion"], obj["kind"]))
                # Strict: a field the server does not know is an error, not silently dropped
                # (TrainJob's runtimePatches on a Trainer older than v2.2.0, say).
                if builtin is not None:
                    api, suffix = builtin
                    getattr(self.apis[api], f"create_{suffix}")(ns, obj, field_validation="Strict")
                else:
                    k = kind_of(obj)
                    self.custom.create_namespaced_custom_object(
                        k.group, k.version, ns, k.plural, obj, field_validation="Strict"
                    )
            except api_errors() as exc:
                error = self._api_error(exc, f"create {obj['kind']} {ns}/{name}")
                undone = self._undo(created)
                if undone:
                    error = ClusterError(f"{error}; removed again: {', '.join(undone)}")
                raise error from exc
            created.append(obj)
        return [f"{o['kind']}/{o['metadata']['name']}" for o in created]

    def _check_queues(self, objects: list[Obj]) -> None:
        """Every Kueue queue the objects name exists in their namespace (UserInputError if not)."""
        wanted = {
            (o["metadata"]["namespace"], q)
            for o in objects
            if (q := (o["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL))
        }
        k = LOCAL_QUEUES
        for ns, queue in sorted(wanted):
            try:
                listed = self.custom.list_namespaced_custom_object(k.group, k.version, ns, k.plural)
            except api_errors() as exc:
                if _status_code(exc) == 404:
                    missing = (
                        f"Kueue is not installed on this cluster (no {k.group} LocalQueues); "
                        "install it or drop spec.queue; nothing was created"
                    )
                    raise UserInputError([FieldError("spec.queue", missing)]) from exc
                raise self._api_error(exc, f"list LocalQueues in {ns}") from exc
            names = sorted(q["metadata"]["name"] for q in listed.get("items", []))
            if queue not in names:
                have = f"queues there: {', '.join(names)}" if names else "it has none"
                raise UserInputError([FieldError("spec.queue", (
                    f"no LocalQueue {queue!r} in namespace {ns} ({have}); the job would wait "
                    "suspended forever; nothing was created"))])  # fmt: skip

    def _undo(self, created: list[Obj]) -> list[str]:
        """Delete ``created`` (newest first), best effort; return what was deleted."""
        undone = []
        for obj in reversed(created):
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            try:
                builtin = BUILTIN_KINDS.get((obj["apiVersion"], obj["kind"]))
                if builtin is not None:
                    api, suffix = builtin
                    getattr(self.apis[api], f"delete_{suffix}")(name, ns)
                else:
                    k = kind_of(obj)
                    self.custom.delete_namespaced_custom_object(
                        k.group, k.version, ns, k.plural, name,
                        body={"propagationPolicy": "Background"},
                    )  # fmt: skip
            except api_errors():
                continue  # reported by what is left; the refusal is the error that matters
            undone.append(f"{obj['kind']}/{name}")
        return undone

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
        except api_errors() as exc:
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
        events = self._pending_events(pods) + self._refused_pods(name)
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
        except api_errors() as exc:
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
            except api_errors() as exc:
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
        except api_errors() as exc:
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
            except api_errors() as exc:
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
        except api_errors() as exc:
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
        except api_errors() as exc:
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
        except api_errors() as exc:
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

    def _refused_pods(self, name: str) -> list[Obj]:
        """The controllers' FailedCreate events for the job (or its child Jobs): pods the API
        server refused (quota, PodSecurity), which no pod status shows. The training-operator
        names its event FailedCreatePod."""
        events = []
        for reason in FAILED_CREATE_REASONS:
            try:
                found = self.core.list_namespaced_event(
                    self.namespace, field_selector=f"reason={reason}"
                )
            except api_errors() as exc:
                raise self._api_error(exc, f"list {reason} events") from exc
            events += [_as_dict(e) for e in _items(found)]
        return [
            e for e in events
            if (o := e.get("involvedObject") or {}).get("name") == name
            or str(o.get("name", "")).startswith(f"{name}-")
        ]  # fmt: skip

    def _list_events(self, pod: str) -> list[Obj]:
        try:
            found = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}"
            )
        except api_errors() as exc:
            raise self._api_error(exc, f"list events of pod {pod}") from exc
        return [_as_dict(e) for e in _items(found)]

    def _api_error(self, exc: Exception, doing: str) -> ClusterError:
        """The client's error as one line: what we were doing and what the API server said."""
        code = _status_code(exc)
        if code is None:
            return ClusterError(f"{doing}: cannot reach the API server: {exc}")
        reason = {
            401: "unauthorized (expired or unknown credentials: renew the kubeconfig)",
            403: "forbidden",
            404: "not found (is the operator's CRD installed?)",
            409: "already exists (gpufleet cancel it first)",
            422: "rejected as invalid",
        }
        detail = _server_message(exc)
        what = reason.get(code, f"HTTP {code}")
        if code == 403 and " cannot " in detail:
            what = "forbidden (RBAC)"
        return ClusterError(f"{doing}: {what}: {detail}" if detail else f"{doing}: {what}")


def _server_message(exc: Exception) -> str:
    """The API server's own words: the ``message`` of its Status body (one line), else the
    body or reason as given."""
    import json

    body = getattr(exc, "body", "") or ""
    try:
        message = json.loads(body).get("message", "") if body else ""
    except (ValueError, AttributeError):
        message = ""
    text = str(message or body or getattr(exc, "reason", "") or "")
    return " ".join(text.split())[:500]


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
