"""The real-node cluster for tests: one `gpufleet cluster up --nodes 0 --real-nodes 2` (the
chart's lab values: each node has 4 "A30", which are the CPU), started by the first test that
asks for it and stopped at the session's end, after the kwok cluster (one control plane at a
time); and what the host looks like before and after, to prove `down` leaves nothing behind."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from gpufleet.cluster.keptlogs import READER_LABEL
from gpufleet.devcluster import platform
from gpufleet.devcluster.build import binaries_dir
from gpufleet.devcluster.realnodes import metrics
from gpufleet.devcluster.realnodes.host import (
    FIXED_PATHS,
    HOST_RECORD,
    KUBELET_SYSCTLS,
    hierarchies,
    undo_orphan,
)
from gpufleet.devcluster.realnodes.images import image_cache, names_in
from gpufleet.devcluster.state import DEFAULT_DIR, State
from gpufleet.launch.shim import WORKER_NAME
from tests.support import devcluster, references
from tests.support.cli import run_cli
from tests.support.devcluster import DevCluster, tenant_user
from tests.support.docpages import DOCS, Terminal, blocks, commands, failed
from tests.support.paths import REPO
from tests.support.procs import poll_until
from tests.support.references import WORKLOAD
from tests.support.specs import digits_job, write_spec

LOCAL_CLUSTER_PAGE = DOCS / "local-cluster.md"  # starts the cluster, installs the chart


def page_real_nodes() -> int:
    """The page's `cluster up --real-nodes N` (its group "cluster"): N has one home."""
    (line,) = [c for b in blocks(LOCAL_CLUSTER_PAGE) if b.group == "cluster"
               for c in commands(b.code) if c.startswith("gpufleet cluster up ")]  # fmt: skip
    argv = shlex.split(line)
    return int(argv[argv.index("--real-nodes") + 1])


REAL_NODES = page_real_nodes()
NODE_BINARIES = ("kubelet", "kube-proxy", "kube-router", "containerd", "containerd-shim-runc-v2",
                 "runc", "cni-bridge", "coredns", "pause", *metrics.BINARIES)  # fmt: skip
BUILT = all((binaries_dir() / name).is_file() for name in NODE_BINARIES)


def others(path: Path, mine: Path) -> bool:
    """Whether ``path`` lies in another pytest(-xdist) process's temporary directory, beside
    ``mine`` (this one's): a test running there beside the cluster (the full-disk test's tmpfs,
    an S3 server on its own directory) starts and stops things at any time."""
    return path.is_relative_to(mine.parent) and not path.is_relative_to(mine)


def cluster_mounts(mountinfo: str, mine: Path) -> list[str]:
    """The mount points of ``mountinfo`` (/proc/self/mountinfo's text) but ``others``'."""
    points = [Path(line.split()[4]) for line in mountinfo.splitlines()]
    return sorted(str(p) for p in points if not others(p, mine))


def cluster_process(exe: str, argv: list[str], where: Path, mine: Path) -> bool:
    """Whether a process of ``exe`` with ``argv`` counts: a built binary's (in ``where``) but
    none whose arguments name ``others``' paths (the other worker's versitygw)."""
    named = (Path(a.split("=", 1)[-1]) for a in argv if "/" in a)
    return Path(exe).is_relative_to(where) and not any(others(p, mine) for p in named)


def host_snapshot(mine: Path) -> dict[str, object]:
    """What real nodes may change on the host: processes of the built binaries, mounts, cgroups,
    network namespaces and links, the kubelet's sysctls, fixed paths; not what the other
    pytest worker starts beside ``mine`` (cluster_mounts, cluster_process)."""
    procs = []
    for proc in psutil.process_iter():
        try:
            exe, argv = proc.exe(), proc.cmdline()
        except psutil.Error:
            continue
        if cluster_process(exe, argv, binaries_dir(), mine):
            procs.append(exe)
    ip = lambda *a: subprocess.run(["ip", *a], capture_output=True, text=True).stdout  # noqa: E731
    links = sorted(line.split(":")[1].strip().split("@")[0] for line in
                   ip("-o", "link", "show").splitlines())  # fmt: skip
    return {
        "processes": sorted(procs),
        "mounts": cluster_mounts(Path("/proc/self/mountinfo").read_text(), mine),
        "cgroups": sorted(str(h / "gpufleet") for h in hierarchies() if (h / "gpufleet").exists()),
        "netns": ip("netns", "list"),
        "links": links,
        "sysctls": {k: (Path("/proc/sys") / k).read_text() for k in KUBELET_SYSCTLS},
        "paths": {p: os.path.lexists(p) for p in (*FIXED_PATHS, str(HOST_RECORD))},
    }


def session_real_cluster(factory: pytest.TempPathFactory) -> Iterator[devcluster.DevCluster]:
    """The body of the fixture ``realcluster``: the cluster that docs/local-cluster.md starts,
    by the page's own blocks (its group "cluster"), then its group "down" and the host as it
    was before (a difference fails the last test that used it)."""
    if not devcluster.BUILT or not BUILT:
        pytest.skip(f"real nodes' components not built in {binaries_dir()} (make controlplane)")
    devcluster.stop_running()
    project_image()  # the archive the page imports (built by `make test` before the suite)
    # What a run killed with its cluster left (HOST_RECORD) is undone first, as `up` would.
    undo_orphan(Path("/nonexistent"), print)
    before = host_snapshot(factory.getbasetemp())
    references.prefetch(factory.mktemp("references"))  # the local runs to compare with
    terminal = Terminal()
    try:
        up = terminal.run(LOCAL_CLUSTER_PAGE, "cluster", timeout=900)
        assert up.returncode == 0, failed(up)
    except BaseException:
        references.stop_prefetch()
        # What a failed `up` started, `down` stops (the page's own "down" needs the shell
        # that a successful "cluster" group leaves: its venv activated).
        run_cli("cluster", "down", cwd=terminal.cwd, timeout=300)
        raise
    cluster = devcluster.DevCluster(factory.mktemp("realcluster"), terminal.cwd / DEFAULT_DIR,
                                    up, terminal=terminal)  # fmt: skip
    try:
        yield cluster
    finally:
        try:
            references.stop_prefetch()
        finally:
            down = terminal.run(LOCAL_CLUSTER_PAGE, "down", timeout=300)
            assert down.returncode == 0, failed(down)
        after = host_snapshot(factory.getbasetemp())
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert not changed, f"cluster down left the host changed: {changed}"


@functools.cache
def project_image() -> tuple[str, Path]:
    """The project's CPU image (`make image`: scripts/build-image.sh, a no-op when its
    inputs did not change): its name and OCI archive, the one docs/local-cluster.md's
    `cluster up --image` imports."""
    built = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "cpu"],
                           capture_output=True, text=True, cwd=REPO, timeout=3600)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    archive = (image_cache() / "gpufleet-cpu.tar").resolve()
    (name,) = names_in(archive)
    return name, archive


# The lab's tenant on the real nodes, and its shared claim for checkpoints.
TENANT = "research"
# The page's claim for checkpoints (its group "platform" creates it): its name has one home.
CLAIM_FILE = REPO / "examples" / "local-cluster" / "checkpoints-claim.yaml"
CLAIM = yaml.safe_load(CLAIM_FILE.read_text())["metadata"]["name"]


def session_lab(cluster: devcluster.DevCluster) -> Iterator[devcluster.DevCluster]:
    """The body of the fixture ``reallab``: docs/local-cluster.md's group "platform" on the
    real-node cluster, in the page's shell: the chart installed by the helm command that
    `cluster up` printed (the lab's values, then the ones `up` wrote for this cluster:
    devcluster/platform.py), the checkpoint claim, and `gpufleet doctor` with no FAIL."""
    assert cluster.terminal is not None
    page, printed = page_helm_install(), printed_helm_install(cluster)
    assert page == printed, f"the page's helm install is not the one `up` printed: {printed}"
    done = cluster.terminal.run(LOCAL_CLUSTER_PAGE, "platform", timeout=600)
    assert done.returncode == 0, failed(done)
    try:
        yield cluster
    finally:
        cluster.core.delete_namespaced_persistent_volume_claim(CLAIM, TENANT)
        cluster.helm("uninstall", platform.RELEASE, "-n", platform.NAMESPACE, "--wait")


def printed_helm_install(cluster: devcluster.DevCluster) -> list[str]:
    """The arguments of the `helm install` that `cluster up` printed."""
    (line,) = [x.strip() for x in cluster.up.stderr.splitlines()
               if x.strip().startswith("helm install ")]  # fmt: skip
    return shlex.split(line.split("#", 1)[0])


def page_helm_install() -> list[str]:
    """The arguments of the page's `helm install` (its group "platform")."""
    (line,) = [c for b in blocks(LOCAL_CLUSTER_PAGE) for c in commands(b.code)
               if c.startswith("helm install ")]  # fmt: skip
    return shlex.split(line)


def processes_in_pod(pod_uid: str, marker: bytes) -> list[int]:
    """Host pids of a pod's processes (by its cgroup: its UID as the cgroupfs driver writes
    it) with ``marker`` as one of their arguments."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cgroup = (proc / "cgroup").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"pod{pod_uid}" in cgroup and marker in argv:
            pids.append(int(proc.name))
    return pids


def pod_processes(pod_uid: str, worker_only: bool) -> list[int]:
    """Host pids of a pod's launcher (gpufleet.launch.pod, the container's process), its
    forkserver (the launcher's fork, its command line the same: gpufleet.launch.zygote) and its
    training workers (named gpufleet-rank<RANK>: gpufleet.launch.forked), found by the pod's
    cgroup (its UID as the cgroupfs driver writes it); ``worker_only``: the workers alone."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cgroup = (proc / "cgroup").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            name = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if f"pod{pod_uid}" not in cgroup:
            continue
        launcher = b"gpufleet.launch.pod" in argv
        if name.startswith(WORKER_NAME) or (launcher and not worker_only):
            pids.append(int(proc.name))
    return pids


# The digits job on the real nodes, and what its runs say (tests/cluster/test_realnodes_*.py).
DIGEST = re.compile(r"state digest ([0-9a-f]{16,})")


def real_job(name: str, nodes: int, procs: int, framework: str = "pytorch") -> dict[str, Any]:
    volume = {"name": "ckpt", "mountPath": "/ckpt", "claimName": CLAIM}
    doc = digits_job(name, workload=WORKLOAD, nodes=nodes, procsPerNode=procs,
                     resources={"gpu": procs}, queue=TENANT, image=project_image()[0],
                     checkpoint={"dir": f"/ckpt/{name}", "everySteps": 10},
                     volumes=[volume], framework=framework)  # fmt: skip
    doc["metadata"]["namespace"] = TENANT
    return doc


def pod_log(cluster: DevCluster, pod: str, namespace: str = TENANT, **options: Any) -> str:
    """A pod's log in the tenant or ``namespace`` ("" while its container has not started: the
    API refuses, and an empty log reads as None in the kubernetes client, seen once in three
    runs)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return cluster.core.read_namespaced_pod_log(pod, namespace, **options) or ""
    except ApiException:
        return ""


def log_time(cluster: DevCluster, pattern: re.Pattern[str], name: str) -> float | None:
    """When a pod of ``name`` logged ``pattern`` (the kubelet's timestamp), as a Unix time."""
    for pod in cluster.pods(TENANT, name):
        for line in pod_log(cluster, pod["metadata"]["name"], timestamps=True).splitlines():
            if pattern.search(line):
                stamp = line.split(" ", 1)[0]
                return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()
    return None


def running_pod(cluster: DevCluster, name: str, index: int) -> dict[str, Any] | None:
    """Job ``name``'s pod of completion index ``index``, Running and not being deleted."""
    for pod in cluster.pods(TENANT, name):
        live = pod["status"].get("phase") == "Running" and not pod["metadata"].get(
            "deletionTimestamp"
        )
        if live and pod["metadata"]["name"].startswith(f"{name}-{index}-"):
            return pod
    return None


def exit_code(pod: dict[str, Any]) -> int | None:
    """The exit code of the pod's container, once it ended."""
    for status in pod["status"].get("containerStatuses") or []:
        done = status.get("state", {}).get("terminated")
        if done:
            return int(done["exitCode"])
    return None


def node_ready(cluster: DevCluster, node: str) -> bool:
    conditions = cluster.core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def jobset_status(cluster: DevCluster, name: str) -> dict[str, Any]:
    """The tenant's JobSet ``name``'s status."""
    jobset = cluster.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", TENANT, "jobsets", name
    )
    return dict(jobset["status"])


def digests_in_logs(cluster: DevCluster, name: str) -> list[str]:
    logs = cluster.gpufleet("logs", name, "-n", TENANT)
    assert logs.returncode == 0, logs.stderr[-2000:]
    return DIGEST.findall(logs.stdout)


def kept_logs_once_pods_are_gone(cluster: DevCluster, name: str) -> str:
    """Delete the finished job's pods (as a clean-up or an eviction would), then `gpufleet
    logs` as a member of the tenant: the ranks' logs kept beside the checkpoints, read by a
    reader pod that is gone afterwards."""
    cluster.core.delete_collection_namespaced_pod(TENANT, label_selector=f"gpufleet.dev/job={name}")
    poll_until(lambda: not cluster.pods(TENANT, name), what=f"{name}'s pods gone", timeout=60)
    member = tenant_user(cluster, "bob", TENANT)
    logs = cluster.gpufleet_as(member, "logs", name, "-n", TENANT)
    assert logs.returncode == 0, logs.stderr[-2000:]
    assert f"{name} has no pods" in logs.stderr, logs.stderr
    readers = cluster.core.list_namespaced_pod(TENANT, label_selector=f"{READER_LABEL}={name}")
    assert not readers.items, [p.metadata.name for p in readers.items]
    return logs.stdout


# Set by benchmarks/cluster_chaos.py: the real-node failure tests left out of `make test` too.
CHAOS_FULL = "GPUFLEET_CHAOS_FULL"


def benchmark_only(value: str) -> Any:
    """A parameter of a real-node failure test that only benchmarks/cluster_chaos.py runs (the
    suite runs the test's other cases)."""
    reason = f"in benchmarks/cluster_chaos.py (${CHAOS_FULL})"
    return pytest.param(value, marks=pytest.mark.skipif(not os.environ.get(CHAOS_FULL),
                                                        reason=reason))  # fmt: skip


def submit(cluster: DevCluster, doc: dict[str, Any], target: str = "job") -> None:
    """Write ``doc`` and `gpufleet submit` it to ``target``."""
    path = write_spec(cluster.root, doc, f"{doc['metadata']['name']}.yaml")
    done = cluster.gpufleet("submit", str(path), "--target", target)
    assert done.returncode == 0, done.stderr[-2000:]


def checkpoints(cluster: DevCluster, name: str) -> list[Path]:
    """Job ``name``'s complete checkpoints on the shared volumes, oldest first."""
    return sorted(p.parent for p in (cluster.dir / "volumes").glob(f"pv-*/{name}/*/COMPLETE.json"))


def checkpoint_step(checkpoint: Path) -> int:
    """The step of a checkpoint directory (``step_000000050-3f9a1c``)."""
    return int(checkpoint.name.removeprefix("step_").split("-", 1)[0])


def pods_after_first_checkpoint(cluster: DevCluster, name: str) -> tuple[Any, Any]:
    """Once job ``name`` committed a checkpoint: its running pods 0 and 1."""
    poll_until(lambda: checkpoints(cluster, name), what=f"{name}'s first checkpoint",
               timeout=300, interval=0.5)  # fmt: skip
    pod_0, pod_1 = (poll_until(lambda i=i: running_pod(cluster, name, i), what=f"pod {i}")
                    for i in (0, 1))  # fmt: skip
    return pod_0, pod_1


def record(case: str, **numbers: float) -> None:
    """A test's measurements, one JSON line appended to the file $GPUFLEET_RECORD names (the
    benchmarks that run these tests read it: benchmarks/cluster_chaos.py); nothing otherwise."""
    where = os.environ.get("GPUFLEET_RECORD")
    if where:
        with open(where, "a") as out:
            out.write(json.dumps({"case": case, **numbers}) + "\n")


def prometheus_url(cluster: DevCluster) -> str:
    """The cluster's Prometheus (its port in the cluster's state)."""
    state = State.read(cluster.dir)
    assert state is not None
    return f"http://127.0.0.1:{state.ports[metrics.PROMETHEUS]}"


def prometheus(cluster: DevCluster, path: str, **params: Any) -> list[dict[str, Any]]:
    """The result of a query of the cluster's Prometheus."""
    url = f"{prometheus_url(cluster)}/api/v1/{path}"
    with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode(params)}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])
