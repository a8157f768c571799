"""The digits job trained across real nodes: the project's image (built here, imported into
each node) in pods that pass `restricted`, queued by Kueue with the chart's lab values,
meeting over the headless Service's DNS names, checkpointing as UID 1000 to a shared
PersistentVolumeClaim, and ending with the very weights a local `gpufleet run` of the same
job ends with (its state digest, from rank 0's log through `gpufleet logs`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import pytest

from gpufleet.devcluster.realnodes.network import HOST_IP
from gpufleet.errors import UserInputError
from gpufleet.runtime.integrity import MARKER
from tests.support import sealed as sealing
from tests.support.devcluster import BoundPods, DevCluster, tenant_user
from tests.support.procs import poll_until
from tests.support.realnodes import (
    DIGEST,
    TENANT,
    digests_in_logs,
    kept_logs_once_pods_are_gone,
    pod_processes,
    real_job,
    submit,
)
from tests.support.references import LONG, WORKLOAD, local_digest
from tests.support.s3 import S3, VERSITYGW, versitygw
from tests.support.specs import write_spec

# The first test here may start the real-node cluster: importing a new image into both nodes
# takes minutes on 2 cores (test setup counts toward the timeout).
pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip


def why(cluster: DevCluster, name: str, pods: dict[str, dict[str, Any]]) -> str:
    """What a failed job's pods said: every pod seen (phase, exit codes), its status with
    reasons, and the logs (the kept ones when no pod is left)."""
    seen = [(n, p["status"].get("phase"), [s.get("state") for s in
             p["status"].get("containerStatuses") or []]) for n, p in pods.items()]  # fmt: skip
    status = cluster.gpufleet("status", name, "-n", TENANT, "--pods")
    logs = cluster.gpufleet("logs", name, "-n", TENANT)
    return f"{seen}\n{status.stdout}{status.stderr}\n{logs.stdout[-3000:]}{logs.stderr[-1000:]}"


# Volcano's last: its pods take GPUs that Kueue does not count, so it runs once Kueue's are done.
ENGINES = [("job", 2, 1, "pytorch"), ("job", 2, 2, "pytorch"), ("pytorchjob", 2, 1, "pytorch"),
           ("trainjob", 2, 1, "pytorch"), ("mpijob", 2, 1, "pytorch"),
           ("job", 2, 1, "tensorflow"), ("tfjob", 2, 1, "tensorflow"),
           ("volcano", 2, 1, "pytorch")]  # fmt: skip
ENGINES_TEST = "test_digits_across_real_nodes_ends_with_the_local_runs_weights"
AT_ONCE = 2  # jobs of 2 pods x 2 GPUs: both real nodes' 4 GPUs, research's 6 and 2 borrowed
GPUS = "nvidia.com/gpu"
ENDED = ("Succeeded", "Failed")


def engine_job(target: str, nodes: int, procs: int, framework: str) -> str:
    return f"{'tf' if framework == 'tensorflow' else 'digits'}-{target}-{nodes}x{procs}"


def engine_doc(name: str, nodes: int, procs: int, framework: str) -> dict[str, Any]:
    """Each pod holds 2 of its node's 4 GPUs: a job submitted while another's pods hold 2 on each
    node can only be placed across both nodes."""
    doc = real_job(name, nodes, procs, framework)
    doc["spec"]["resources"] = {"gpu": 2}
    return doc


class Engines:
    """The engines' jobs that Kueue queues, AT_ONCE at a time, each pod watched from its job's
    submission: one job's pods start while another's train (the eight took 215 s one after
    another, 111 s so). The next job is submitted once the last one's pods are placed, so it
    finds 2 GPUs free on each node, never 4 on one."""

    def __init__(self, cluster: DevCluster, cases: list[dict[str, Any]]) -> None:
        self.cluster, self.waiting = cluster, [c for c in cases if c["target"] != "volcano"]
        self.seen: dict[str, BoundPods] = {}
        self.submitted: list[str] = []
        self.ended: set[str] = set()  # seen ended by its test (and then cancelled: no phase)

    def watch(self, name: str) -> BoundPods:
        if name not in self.seen:
            self.seen[name] = BoundPods(self.cluster, TENANT, name).__enter__()
        return self.seen[name]

    def close(self, name: str) -> dict[str, dict[str, Any]]:
        """End the watch of ``name``'s pods: every state of them seen, to the end."""
        seen = self.seen[name]
        if not seen.done.is_set():
            seen.__exit__(None, None, None)
        return seen.pods

    def top_up(self) -> None:
        """Submit the next jobs while fewer than AT_ONCE run."""
        while self.waiting and len(self.running()) < AT_ONCE:
            self.submit(self.waiting.pop(0))

    def running(self) -> list[str]:
        return [n for n in self.submitted
                if n not in self.ended and self.cluster.phase(n, TENANT) not in ENDED]  # fmt: skip

    def submit(self, case: dict[str, Any]) -> None:
        """Submit a case's job and wait until its workers are placed (or it ended)."""
        name = engine_job(**case)
        seen = self.watch(name)
        submit(self.cluster, engine_doc(name, case["nodes"], case["procs"], case["framework"]),
               case["target"])  # fmt: skip
        self.submitted.append(name)
        poll_until(lambda: len(workers(seen.pods)) == case["nodes"] or
                   self.cluster.phase(name, TENANT) in ENDED,
                   what=f"{name}'s workers placed", timeout=300, interval=0.5)  # fmt: skip


def workers(pods: dict[str, dict[str, Any]]) -> list[str]:
    """The pods that hold GPUs (an MPIJob's launcher holds none)."""
    found = []
    for name, pod in pods.items():
        limits = [c.get("resources", {}).get("limits") or {} for c in pod["spec"]["containers"]]
        if any(GPUS in held for held in limits):
            found.append(name)
    return found


@pytest.fixture(scope="module")
def engines(reallab: DevCluster, request: pytest.FixtureRequest) -> Iterator[Engines]:
    """The selected engine cases, fed to Kueue by their tests; what is left, cancelled."""
    cases = [item.callspec.params for item in request.session.items
             if item.name.startswith(ENGINES_TEST + "[")]  # fmt: skip
    fed = Engines(reallab, cases)
    try:
        yield fed
    finally:
        for name in fed.seen:
            with suppress(UserInputError):  # cancelled by its test already
                reallab.cancel(name, TENANT)
            fed.close(name)


@pytest.mark.parametrize(("target", "nodes", "procs", "framework"), ENGINES)
def test_digits_across_real_nodes_ends_with_the_local_runs_weights(
    reallab: DevCluster, engines: Engines, target: str, nodes: int, procs: int, framework: str
) -> None:
    """(The jobset 2x1 case is docs/local-cluster.md's job: test_docs_local_cluster.py.)
    TensorFlow too: its workers meet over the pods' names on port 2222 (GPUFLEET_TF_WORKERS,
    or the training-operator's TF_CONFIG for a TFJob) and end with the local run's weights."""
    name = engine_job(target, nodes, procs, framework)
    engines.watch(name)
    if target == "volcano":  # after Kueue's (Engines)
        submit(reallab, engine_doc(name, nodes, procs, framework), target)
    engines.top_up()
    phase = poll_until(lambda: (p := reallab.phase(name, TENANT)) in ENDED and p,
                       what=f"{name} to end", timeout=300, interval=1)  # fmt: skip
    engines.ended.add(name)
    pods = engines.close(name)
    assert phase == "Succeeded", why(reallab, name, pods)
    placed = {p["spec"]["nodeName"] for p in pods.values()}
    assert len(placed) == nodes and all(n.startswith("real-") for n in placed), placed
    # spec.nodeLossTimeout reached the pods through each controller (not the API server's 300 s)
    lost = [{t.get("tolerationSeconds") for t in p["spec"]["tolerations"] if t.get("key") in
             ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")}
            for p in pods.values()]  # fmt: skip
    assert all(seconds == {30} for seconds in lost), lost
    local = local_digest(reallab.root, nodes, procs, framework=framework)
    assert digests_in_logs(reallab, name) == [local]
    status = reallab.gpufleet("status", name, "-n", TENANT)
    assert status.returncode == 0 and "Succeeded" in status.stdout, status.stdout
    written = list((reallab.dir / "volumes").glob(f"pv-*/{name}/*"))
    assert written, "no checkpoint on the shared volume"
    assert all(p.stat().st_uid == 1000 for p in written), [(p, p.stat().st_uid) for p in written]
    assert reallab.cancel(name, TENANT)
    poll_until(lambda: not reallab.pods(TENANT, name), what=f"{name}'s pods gone", timeout=60)


@pytest.mark.parametrize("crash", ["worker", "container"])
def test_a_crash_mid_run_resumes_from_the_claims_checkpoint(
    reallab: DevCluster, crash: str
) -> None:
    """A crash on pod 1 after the first checkpoint (SIGKILL, as the kernel's OOM killer
    would): its training process alone (torchrun restarts the group inside the pods), or its
    whole container (the Job makes a new pod 1, whose new agent joins the group pod 0 still
    hosts). The job resumes from the checkpoint on the shared claim and ends with the
    uninterrupted run's weights."""
    import os
    import signal

    name, (steps, every) = f"crash-{crash}", LONG
    doc = real_job(name, 2, 1)
    doc["spec"]["workload"] = {**WORKLOAD, "steps": steps, "logEvery": 100}
    doc["spec"]["checkpoint"]["everySteps"] = every
    doc["spec"]["metrics"] = {"port": 9410}
    path = write_spec(reallab.root, doc, f"{name}.yaml")
    submit = reallab.gpufleet("submit", str(path), "--target", "job")
    assert submit.returncode == 0, submit.stderr[-2000:]
    checkpoints = reallab.dir / "volumes"

    def victim() -> dict[str, Any] | None:
        if not list(checkpoints.glob(f"pv-*/{name}/*/COMPLETE.json")):
            return None
        pods = [p for p in reallab.pods(TENANT, name) if p["status"].get("phase") == "Running"]
        return next((p for p in pods if p["metadata"]["name"].startswith(f"{name}-1-")), None)

    pod = poll_until(victim, what="the first checkpoint", timeout=240, interval=0.2)
    # `status` reads the ranks' progress from the pods' metrics port through the API server,
    # as a member of the tenant (the chart's Role lets its members through the pod proxy)
    member = tenant_user(reallab, "bob", TENANT)
    running = reallab.gpufleet_as(member, "status", name, "-n", TENANT).stdout
    progress = rf"progress: step \d+/{steps} \(\d+ %\), [\d,]+ samples/s, about .+ to go, "
    assert re.search(progress + r"last checkpoint at step \d+", running), running
    pids = pod_processes(pod["metadata"]["uid"], worker_only=crash == "worker")
    assert len(pids) == (1 if crash == "worker" else 3), pids  # + the launcher, its forkserver
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    phase, pods = reallab.run_to_end(name, TENANT, timeout=300)
    logs = reallab.gpufleet("logs", name, "-n", TENANT).stdout
    assert phase == "Succeeded", logs[-3000:]
    assert re.search(r"resum\w* from .*step \d+", logs, re.I), logs[-3000:]
    pod_1 = [n for n in pods if n.startswith(f"{name}-1-")]
    assert len(pod_1) == (1 if crash == "worker" else 2), pods.keys()
    local = local_digest(reallab.root, 2, 1, steps, every)
    assert digests_in_logs(reallab, name) == [local]
    # the ranks' output outlives the pods, the tries before the crash's restart included
    kept = kept_logs_once_pods_are_gone(reallab, name)
    assert DIGEST.findall(kept) == [local], kept[-3000:]
    assert re.search(r"^\[\S+ attempt \d+ rank \d+\] gpufleet: resumed from step \d+", kept,
                     re.M), kept[-3000:]  # fmt: skip


@pytest.fixture(scope="module")
def pod_s3(reallab: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """A real S3 server (versitygw) on the address the real nodes reach the host by (the
    bridge's), a bucket 'ckpt', and its credentials in a Secret of the tenant (never in the
    job's spec), sealed offline with kubeseal and unsealed by the cluster's Sealed Secrets
    controller: the sealed manifest holds none of them."""
    if not VERSITYGW.is_file():
        pytest.skip(f"versitygw not built at {VERSITYGW} (scripts/build-controlplane.sh)")
    with versitygw(tmp_path_factory.mktemp("s3"), host=HOST_IP) as server:
        server.bucket("ckpt")
        sealed = sealing.seal(reallab, TENANT, "s3-ckpt", server.env)
        assert not any(v in json.dumps(sealed) for v in (server.access_key, server.secret_key))
        sealing.apply(reallab, sealed)
        try:
            assert sealing.unsealed(reallab, TENANT, "s3-ckpt") == server.env
            yield server
        finally:
            reallab.custom.delete_namespaced_custom_object(
                sealing.GROUP, sealing.VERSION, TENANT, sealing.PLURAL, "s3-ckpt"
            )


def run_with_s3(cluster: DevCluster, name: str, checkpoint: dict[str, Any]) -> None:
    """Submit the real-node digits job ``name`` with ``checkpoint`` changed and the bucket's
    credentials by envFrom; it must succeed."""
    doc = real_job(name, 2, 1)
    doc["spec"]["checkpoint"].update(checkpoint)
    doc["spec"]["envFrom"] = [{"secretRef": {"name": "s3-ckpt"}}]
    path = write_spec(cluster.root, doc, f"{name}.yaml")
    submit = cluster.gpufleet("submit", str(path), "--target", "job")
    assert submit.returncode == 0, submit.stderr[-2000:]
    phase, _ = cluster.run_to_end(name, TENANT, timeout=300)
    assert phase == "Succeeded", cluster.gpufleet("logs", name, "-n", TENANT).stdout[-3000:]


def test_pods_checkpoint_to_s3_and_end_with_the_local_runs_weights(
    reallab: DevCluster, pod_s3: S3
) -> None:
    """Both pods write their checkpoint shards to the bucket through the Service network (the
    credentials from the Secret by envFrom); rank 0's marker completes each checkpoint."""

    name = "digits-s3"
    run_with_s3(reallab, name, {"dir": f"s3://ckpt/{name}"})
    s3 = pod_s3.client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix=name)["Contents"]]
    steps = {k.split("/")[1] for k in keys if k.endswith(MARKER)}
    assert any(s.startswith("step_000000040-") for s in steps), keys
    assert sum(k.endswith(".distcp") for k in keys) >= 2 * len(steps), keys  # one per rank
    local = local_digest(reallab.root, 2, 1)
    assert digests_in_logs(reallab, name) == [local]
    # the ranks' logs kept in the bucket, read back with the job's own credentials
    assert any(k.startswith(f"{name}/logs/") and k.endswith("stdout.log") for k in keys), keys
    assert DIGEST.findall(kept_logs_once_pods_are_gone(reallab, name)) == [local]


def test_pods_with_a_durable_tier_each_upload_their_ranks_files_and_end_exact(
    reallab: DevCluster, pod_s3: S3
) -> None:
    """Fast tier on the claim, durable tier in the bucket (spec.checkpoint.durable): each pod's
    launcher uploads the files of its own rank, its part recorded; the marker, written last,
    names both pods; the job still ends with the local run's weights."""
    name = "digits-tiers"
    run_with_s3(reallab, name, {"durable": {"dir": f"s3://ckpt/{name}", "keep": 2}})
    fs = pod_s3.fs()
    complete = sorted(p for p in fs.ls(f"ckpt/{name}") if fs.exists(f"{p}/{MARKER}"))
    # keep 2: at most two; how many of the four were uploaded before a newer one superseded
    # them depends on the pods' pace, the last one (the run's end waits for it) never
    assert 1 <= len(complete) <= 2 and "step_000000040-" in complete[-1], complete
    marker = json.loads(fs.cat_file(f"{complete[-1]}/{MARKER}"))
    hosts = {f["host"] for f in marker["files"].values()}
    assert len(hosts) == 2, marker  # each pod's rank wrote (and its launcher uploaded) its own
    parts = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{complete[-1]}/.parts")}
    assert parts == {f"{h}.json" for h in hosts}, parts
    assert digests_in_logs(reallab, name) == [local_digest(reallab.root, 2, 1)]
