"""The live local control plane for tests: one `gpufleet cluster up` per test session (3 nodes x
4 NVIDIA A30: the chart's 3-node lab), its API clients, helm, and waiting on what the real
controllers do. `make test` builds the components first (scripts/build-controlplane.sh, cached
in .tools/); without them the tests that use it skip saying how to build."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.build import COMPONENTS, binaries_dir
from tests.support.chart import CHART as CHART  # the cluster tests import it from here
from tests.support.cli import cli_env, run_cli
from tests.support.docpages import Terminal
from tests.support.procs import poll_until

NODES, GPUS_PER_NODE, PRODUCT = 3, 4, "NVIDIA-A30"
# kwok's pod Stages capped at this (`cluster up --pod-delay-ms`): uncapped they wait 1-5 s at each
# step of a pod's life (created, ready, completed), most of a cluster test's time.
POD_DELAY_MS = 300
BUILT = all((binaries_dir() / name).is_file() for name in COMPONENTS)
needs_controlplane = pytest.mark.skipif(
    not BUILT, reason=f"control plane not built in {binaries_dir()} (make controlplane)"
)


# How often a test asks for a job's status: each is a dozen requests. Measured on the kwok
# cluster: every 0.2 s cost 0.15 cores (the API server, etcd and the test's process), every
# second 0.02. A job's pods are watched meanwhile (BoundPods): none is missed between polls.
CLUSTER_POLL_S = 1.0


@dataclass
class DevCluster:
    """A running local cluster: its state directory, a scratch root and the admin env."""

    root: Path
    dir: Path
    up: subprocess.CompletedProcess[str]
    # the shell of the docs page that started it (tests/support/docpages.py), if one did
    terminal: Terminal | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def env(self) -> dict[str, str]:
        return cli_env() | {"KUBECONFIG": str(self.kubeconfig)}

    @cached_property
    def api(self) -> Any:
        """An ApiClient on the admin kubeconfig (built from the file: the kubernetes package
        reads KUBECONFIG only once, when first imported)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def typed(self, name: str) -> Any:
        from kubernetes import client

        return getattr(client, name)(self.api)

    @property
    def core(self) -> Any:
        return self.typed("CoreV1Api")

    @property
    def custom(self) -> Any:
        return self.typed("CustomObjectsApi")

    def as_dict(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)

    def gpufleet(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=self.root, env=self.env, timeout=timeout)

    def cancel(self, name: str, namespace: str) -> list[str]:
        """What `gpufleet cancel NAME -n NAMESPACE` deletes, from the same Cluster.cancel, in
        this process: a CLI process costs a CPU-second (the CLI's own cancel: test_devcluster,
        test_devcluster_queues)."""
        from gpufleet.cluster.client import Cluster

        return Cluster.of(self.api, namespace).cancel(name)

    def gpufleet_as(
        self, env: dict[str, str], *args: str, timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        """``gpufleet ARGS`` with another user's environment (kubeconfig)."""
        return run_cli(*args, cwd=self.root, env=env, timeout=timeout)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["helm", *args, "--kubeconfig", str(self.kubeconfig)],
            capture_output=True, text=True, timeout=300, check=False, env=self.env,
        )  # fmt: skip
        if check:
            assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr[-3000:]}"
        return proc

    def ensure_namespace(self, name: str) -> None:
        """A namespace a values file expects to exist (the 50-node design's Alertmanager's,
        ``monitoring``, where its alert routing goes), created if it is not there."""
        if not any(n.metadata.name == name for n in self.core.list_namespace().items):
            self.core.create_namespace({"metadata": {"name": name}})

    def pods(self, namespace: str, job: str | None = None) -> list[dict[str, Any]]:
        selector = f"gpufleet.dev/job={job}" if job else None
        listed = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self.as_dict(p) for p in listed.items]

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        listed = self.custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "workloads"
        )
        return list(listed["items"])

    def phase(self, name: str, namespace: str) -> str:
        """The phase `gpufleet status NAME -o json` reports, from the same Cluster.status, in
        this process ("" when it fails): a CLI process per poll cost a second of CPU, most of
        what the cluster tests used while waiting."""
        from gpufleet.cluster.client import Cluster, api_errors
        from gpufleet.errors import GpufleetError

        try:
            return str(Cluster.of(self.api, namespace).status(name).as_dict()["phase"])
        except (GpufleetError, *api_errors()):
            return ""

    def wait_phase(self, name: str, namespace: str, *phases: str, timeout: float = 120) -> str:
        return poll_until(
            lambda: (p := self.phase(name, namespace)) in phases and p,
            what=f"{namespace}/{name} to be {' or '.join(phases)}",
            timeout=timeout,
            interval=CLUSTER_POLL_S,
        )

    def run_to_end(
        self, name: str, namespace: str, timeout: float = 120
    ) -> tuple[str, dict[str, dict[str, Any]]]:
        """Wait for the job's verdict (Succeeded or Failed); also every pod of it bound to a node
        meanwhile, from a watch (some controllers remove their workers once the job ends, and
        with kwok's short delays a pod can be created, run and go between two polls)."""
        with BoundPods(self, namespace, name) as seen:
            phase = poll_until(
                lambda: (p := self.phase(name, namespace)) in ("Succeeded", "Failed") and p,
                what=f"{namespace}/{name} to end", timeout=timeout, interval=CLUSTER_POLL_S,
            )  # fmt: skip
        return phase, seen.pods

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create a namespace (a test's own, so tests sharing the cluster do not meet)."""
        body = {"metadata": {"name": name, "labels": labels or {}}}
        self.core.create_namespace(body)
        return name


class BoundPods:
    """Every state, seen bound to a node, of the pods of a job: a list, then a watch from the
    list's resourceVersion (the API server sends every change after it, deletions included),
    in a thread until the block ends. At the end, one more list and the rest of the watch's
    window (a second) so changes made before the end are in."""

    WINDOW_S = 1

    def __init__(self, cluster: DevCluster, namespace: str, job: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.selector = f"gpufleet.dev/job={job}"
        self.pods: dict[str, dict[str, Any]] = {}
        self.done = threading.Event()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self.watch, args=(self.list(),), daemon=True)

    def seen(self, pod: Any) -> None:
        doc = self.cluster.as_dict(pod)
        if doc["spec"].get("nodeName"):
            self.pods[doc["metadata"]["name"]] = doc

    def list(self) -> str:
        listed = self.cluster.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        for pod in listed.items:
            self.seen(pod)
        return str(listed.metadata.resource_version)

    def watch(self, version: str) -> None:
        try:
            while not self.done.is_set():
                version = self.watched(version)
        except BaseException as exc:  # re-raised by the test's thread at the end
            self.failed = exc

    def watched(self, version: str) -> str:
        """One window of the watch from ``version``; the version to go on from. A quiet watch
        kept for minutes (its pods gone) finds its version compacted away (410 Expired): a new
        list gives the next, as an informer's does."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        try:
            for event in watch.Watch().stream(
                self.cluster.core.list_namespaced_pod, self.namespace,
                label_selector=self.selector, resource_version=version,
                timeout_seconds=self.WINDOW_S,
            ):  # fmt: skip
                self.seen(event["object"])
                version = event["object"].metadata.resource_version
        except ApiException as exc:
            if exc.status != 410:
                raise
            return self.list()
        return version

    def __enter__(self) -> BoundPods:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.list()
        self.done.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the pod watch did not end"
        if self.failed is not None:
            raise self.failed


def start(
    root: Path,
    *,
    nodes: int = NODES,
    gpus: int = GPUS_PER_NODE,
    without: tuple[str, ...] = (),
    values: Path | None = None,
    extra: tuple[str, ...] = (),
) -> DevCluster:
    state_dir = root / "state"
    leave_out = [arg for name in without for arg in ("--without", name)]
    leave_out += ["--values", str(values)] if values else []
    leave_out += list(extra)
    up = run_cli("cluster", "up", "--nodes", str(nodes), "--gpus-per-node", str(gpus),
                 "--gpu-product", PRODUCT, "--pod-delay-ms", str(POD_DELAY_MS),
                 "--dir", str(state_dir), *leave_out, cwd=root,
                 timeout=900)  # fmt: skip
    assert up.returncode == 0, up.stderr[-3000:]
    return DevCluster(root, state_dir, up)


def stop(cluster: DevCluster) -> None:
    down = run_cli("cluster", "down", "--dir", str(cluster.dir), cwd=cluster.root)
    assert down.returncode == 0, down.stderr[-2000:]


# The session's running clusters: one control plane at a time (the MPI operator's port is
# fixed), so the real-node cluster stops the kwok one first (its tests run last: conftest).
RUNNING: list[DevCluster] = []


def stop_running() -> None:
    """Stop the session's clusters still running (before another starts)."""
    while RUNNING:
        stop(RUNNING.pop())


def session_cluster(factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """The body of the fixture ``devcluster`` (tests/cluster/conftest.py)."""
    if not BUILT:
        pytest.skip(f"control plane not built in {binaries_dir()} (make controlplane)")
    stop_running()
    cluster = start(factory.mktemp("devcluster"))
    RUNNING.append(cluster)
    try:
        yield cluster
    finally:
        if cluster in RUNNING:
            RUNNING.remove(cluster)
            stop(cluster)


def tenant_user(cluster: DevCluster, name: str, group: str) -> dict[str, str]:
    """The env of a tenant's user: a kubeconfig with a client certificate for ``name`` in
    ``group`` from the cluster's CA (how a real cluster's users authenticate, here)."""
    from gpufleet.devcluster.pki import Pki, issue, write_kubeconfig
    from gpufleet.devcluster.state import State

    pki = Pki(cluster.dir / "pki")
    issue(pki, f"user-{name}", name, [group])
    state = State.read(cluster.dir)
    assert state is not None
    path = write_kubeconfig(cluster.root / f"{name}.kubeconfig", state.server, pki, f"user-{name}")
    return cluster.env | {"KUBECONFIG": str(path)}


def workload_of(cluster: DevCluster, ns: str, job: str) -> dict[str, Any] | None:
    """Kueue's Workload of ``job`` (the one it owns), if any."""
    for wl in cluster.workloads(ns):
        owners = wl["metadata"].get("ownerReferences", [])
        if any(o["name"] == job for o in owners):
            return wl
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The condition ``kind`` of ``obj`` when it is True."""
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == kind and c["status"] == "True":
            return dict(c)
    return None
