"""``gpufleet submit | status | logs | cancel``: the official kubernetes client, injected.

``Cluster.connect()`` loads a kubeconfig (``KUBECONFIG``, ``~/.kube/config``) or the in-cluster
service account; tests inject one stand-in for every API (tests/support/fake_kube.py) holding
recorded objects. Everything it fetches goes through ``status.summarize`` (pure, unit-tested).
Only the client's own errors (``api_errors()``) become ClusterError; anything else is a bug of
ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpufleet.cluster.access import as_dict, is_ours, items
from gpufleet.cluster.admission import check_pod_security
from gpufleet.cluster.apierrors import api_errors, server_message, status_code, to_cluster_error
from gpufleet.cluster.builtin import BuiltinApi
from gpufleet.cluster.fleet import fold_status
from gpufleet.cluster.keptlogs import read_kept_logs
from gpufleet.cluster.kinds import (
    BUILTIN_KINDS,
    CLUSTER_QUEUES,
    JOB_KINDS,
    LOCAL_QUEUES,
    PODGROUPS,
    PODMONITORS,
    WORKLOADS,
    Kind,
    kind_of,
)
from gpufleet.cluster.progress import progress_line
from gpufleet.cluster.replaced import split_replaced
from gpufleet.cluster.serving import ServingOperations
from gpufleet.cluster.status import FAILED_CREATE_REASONS, RUNNING, JobStatus
from gpufleet.errors import ClusterError, FieldError, UserInputError
from gpufleet.extras import missing
from gpufleet.kube import (
    KUEUE_QUEUE_LABEL,
    METRICS_PORT_NAME,
    Obj,
    job_selector,
)


class Cluster(ServingOperations):
    """Submit, inspect and cancel gpufleet jobs in one namespace's worth of API calls."""

    @classmethod
    def connect(cls, namespace: str | None = None, context: str | None = None) -> Cluster:
        """Load a kubeconfig (or the in-cluster account); exit 2 saying how if there is none."""
        try:
            from kubernetes import client, config
            from kubernetes.config.config_exception import ConfigException
        except ImportError as exc:
            raise missing("cluster", "kubernetes", "the cluster commands") from exc
        try:
            config.load_kube_config(context=context)
            contexts, active = config.list_kube_config_contexts()
            chosen = next((c for c in contexts if c.get("name") == context), active)
            default_ns = (chosen or {}).get("context", {}).get("namespace") or "default"
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

        apis = {n: BuiltinApi(api_client, n) for n, _ in BUILTIN_KINDS.values()}
        return cls(client.CustomObjectsApi(api_client), apis["CoreV1Api"], namespace, apis)

    # -- submit ----------------------------------------------------------------------------

    def submit(self, objects: list[Obj]) -> list[str]:
        """Create ``objects`` (rendered) in order; return ``kind/name`` of each.

        Every create uses strict field validation. A queued job's LocalQueue is checked first
        (exit 2 if Kueue or the queue is missing: the job would wait, suspended, forever), and
        that its namespace's Pod Security admits its pods (RDMA workers: exit 2). When
        the API server refuses an object, those created before it are deleted again, so nothing
        is left half-applied."""
        objects = [
            {**o, "metadata": {**o["metadata"],
                               "namespace": o["metadata"].get("namespace", self.namespace)}}
            for o in objects
        ]  # fmt: skip
        self._check_queues(objects)
        check_pod_security(self.core, objects)
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
                error = to_cluster_error(exc, f"create {obj['kind']} {ns}/{name}")
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
                if status_code(exc) == 404:
                    missing = (
                        f"Kueue is not installed on this cluster (no {k.group} LocalQueues); "
                        "install it or drop spec.queue; nothing was created"
                    )
                    raise UserInputError([FieldError("spec.queue", missing)]) from exc
                raise to_cluster_error(exc, f"list LocalQueues in {ns}") from exc
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
            if obj is not None and is_ours(obj, name):
                return kind, obj
        return None

    def status(self, name: str) -> JobStatus:
        """The job's (or service's) status line and the reasons it is not running."""
        found = self.find(name)
        if found is None:
            served = self.service_status(name)
            if served is not None:
                return served
            raise self._no_job(name)
        kind, job = found
        pods, replaced = split_replaced(self.pods(name))
        events = self._pending_events(pods) + self._refused_pods(name)
        workload = self.owned_by(WORKLOADS, job)
        local_queue = cluster_queue = None
        if workload is not None:
            local_queue = self._get(LOCAL_QUEUES, workload["spec"].get("queueName", ""))
            cq = ((local_queue or {}).get("spec") or {}).get("clusterQueue")
            cluster_queue = self._get(CLUSTER_QUEUES, cq, cluster_scoped=True) if cq else None
        podgroup = self.owned_by(PODGROUPS, job) if kind.group == "batch.volcano.sh" else None
        status = fold_status(job, pods, replaced, events, workload=workload,
                             local_queue=local_queue, cluster_queue=cluster_queue,
                             podgroup=podgroup)  # fmt: skip
        if status.phase in RUNNING:
            status.progress = progress_line(self.job_metrics(pods))
        return status

    def job_metrics(self, pods: list[Obj]) -> list[str]:
        """The job metrics of each running pod that serves them (its ``metrics`` port), read
        through the API server's pod proxy; a pod that does not answer is left out."""
        texts = []
        for pod in pods:
            containers = (pod.get("spec") or {}).get("containers") or []
            declared = [p for c in containers for p in c.get("ports") or []]
            ports = [p.get("containerPort") for p in declared if p.get("name") == METRICS_PORT_NAME]
            if not ports or (pod.get("status") or {}).get("phase") != "Running":
                continue
            target = f"{pod['metadata']['name']}:{ports[0]}"
            ns = pod["metadata"].get("namespace") or self.namespace
            try:
                # 5 s: where NetworkPolicies drop the API server's connection, no progress
                texts.append(str(self.core.connect_get_namespaced_pod_proxy_with_path(
                    target, ns, "metrics", _request_timeout=5)))  # fmt: skip
            except api_errors():
                continue
        return texts

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
                if status_code(exc) == 400:  # not started yet
                    yield f"[{p}] (no log yet: {server_message(exc)})"
                    continue
                raise to_cluster_error(exc, f"read log of pod {p}") from exc
            for line in str(text).splitlines():
                yield f"[{p}] {line}"

    def _no_job(self, name: str) -> UserInputError:
        return UserInputError(
            [FieldError("NAME", f"no gpufleet job {name!r} in namespace {self.namespace}")]
        )

    def kept_logs(self, name: str, *, tail: int | None = None) -> Iterator[str]:
        """The logs the job's ranks kept beside its checkpoints (gpufleet.cluster.keptlogs),
        oldest pod first; with ``tail``, the last lines of each rank's stderr and stdout."""
        found = self.find(name)
        if found is None:
            raise self._no_job(name)
        try:
            text = read_kept_logs(self.core, self.namespace, found[1], tail=tail)
        except api_errors() as exc:
            raise to_cluster_error(exc, f"read the kept logs of {name}") from exc
        yield from text.splitlines()

    def cancel(self, name: str) -> list[str]:
        """Delete the job (its pods go with it) and its rendezvous Service, if any; or an
        InferenceService's objects."""
        found = self.find(name)
        if found is None:
            deleted = self.delete_service(name)
            if deleted:
                return deleted
            raise self._no_job(name)
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
            for svc in (as_dict(s) for s in items(services)):
                self.core.delete_namespaced_service(svc["metadata"]["name"], self.namespace)
                deleted.append(f"Service/{svc['metadata']['name']}")
            deleted += self._delete_pod_monitors(name)
        except api_errors() as exc:
            raise to_cluster_error(exc, f"delete {kind.kind} {name}") from exc
        return deleted

    def _delete_pod_monitors(self, name: str) -> list[str]:
        """Delete the job's PodMonitor, if it has one (no Prometheus Operator: nothing to do)."""
        k = PODMONITORS
        try:
            listed = self.custom.list_namespaced_custom_object(
                k.group, k.version, self.namespace, k.plural, label_selector=job_selector(name)
            )
        except api_errors() as exc:
            if status_code(exc) == 404:  # the CRD is not installed
                return []
            raise
        deleted = []
        for monitor in listed.get("items", []):
            self.custom.delete_namespaced_custom_object(
                k.group, k.version, self.namespace, k.plural, monitor["metadata"]["name"]
            )
            deleted.append(f"PodMonitor/{monitor['metadata']['name']}")
        return deleted

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
                raise to_cluster_error(exc, f"list {reason} events") from exc
            events += [as_dict(e) for e in items(found)]
        return [
            e for e in events
            if (o := e.get("involvedObject") or {}).get("name") == name
            or str(o.get("name", "")).startswith(f"{name}-")
        ]  # fmt: skip


# Where the kubelet mounts a pod's namespace (beside its service account's token).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _incluster_namespace() -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"
