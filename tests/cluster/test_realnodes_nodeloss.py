"""A real node lost mid-run (issue 29, item 2): the node that hosts pod 0 (the rendezvous
host) loses power (`gpufleet cluster crash-node`: its wire cut, its kubelet, runtime and
containers killed at once). The surviving pod's launcher exits 75 (lost rendezvous), the node
controller marks the node NotReady, the pod on it is evicted after spec.nodeLossTimeout, and
the job goes on without spending maxRestarts, ending with the weights of the same job run
here without interruption: on the node left, once the operator marks the lost node out of
service (Kubernetes' non-graceful node shutdown), or on the node when it comes back.

The timings are recorded where $GPUFLEET_RECORD names a file (benchmarks/cluster_chaos.py)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.support.devcluster import BoundPods, DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import (
    DIGEST,
    TENANT,
    benchmark_only,
    checkpoint_step,
    checkpoints,
    digests_in_logs,
    exit_code,
    kept_logs_once_pods_are_gone,
    node_ready,
    pod_log,
    pods_after_first_checkpoint,
    real_job,
    record,
    running_pod,
    submit,
)
from tests.support.references import LONG, WORKLOAD, local_digest

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip

STEPS, EVERY = LONG
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                  "effect": "NoExecute"}  # fmt: skip
LOST_HOST = re.compile(r"gpufleet: lost the rendezvous host")
STEP_LINE = re.compile(r"step (\d+)")


def taint(cluster: DevCluster, node: str, add: bool) -> None:
    taints = [t for t in (cluster.core.read_node(node).spec.taints or [])
              if t.key != OUT_OF_SERVICE["key"]]  # fmt: skip
    listed = [cluster.as_dict(t) for t in taints] + ([OUT_OF_SERVICE] if add else [])
    cluster.core.patch_node(node, {"spec": {"taints": listed}})


def restore(cluster: DevCluster, node: str) -> None:
    """The lost node back in service, Ready (once; a second call finds it so)."""
    taint(cluster, node, add=False)
    if not node_ready(cluster, node):
        start = cluster.gpufleet("cluster", "start-node", node, "--dir", str(cluster.dir))
        assert start.returncode == 0 or "is running" in start.stderr, start.stderr
        poll_until(lambda: node_ready(cluster, node), what=f"{node} Ready again", timeout=120)


def bring_back(cluster: DevCluster, lost: str, pod: dict[str, Any], back: str) -> float:
    """Once the node is NotReady: the operator's out-of-service taint at once, or the node
    started again after its pod's eviction. Returns when the pod was seen evicted."""
    if back == "out-of-service":
        taint(cluster, lost, add=True)
    # evicted: by the out-of-service taint, else after spec.nodeLossTimeout NotReady
    poll_until(lambda: evicted(cluster, pod), what="the lost pod evicted", timeout=120)
    t_evicted = time.time()
    if back == "node-returns":
        restart = cluster.gpufleet("cluster", "start-node", lost, "--dir", str(cluster.dir))
        assert restart.returncode == 0, restart.stderr
    return t_evicted


def evicted(cluster: DevCluster, pod: dict[str, Any]) -> bool:
    """Whether the pod is being deleted, with the DisruptionTarget condition (which the Job's
    pod failure policy ignores)."""
    from kubernetes.client.exceptions import ApiException

    try:
        now = cluster.core.read_namespaced_pod(pod["metadata"]["name"], TENANT)
    except ApiException:
        return True  # gone already
    target = [c for c in now.status.conditions or [] if c.type == "DisruptionTarget"]
    return now.metadata.deletion_timestamp is not None and bool(target)


def progressed(cluster: DevCluster, name: str, after: int) -> bool:
    """Whether rank 0 of the new pods logged a step past ``after`` (its resume point)."""
    pod = running_pod(cluster, name, 0)
    if pod is None:
        return False
    text = pod_log(cluster, pod["metadata"]["name"])
    return "resumed from step" in text and any(
        int(s) > after for s in STEP_LINE.findall(text.split("resumed from step", 1)[1])
    )


# The node's return after the eviction takes 2.5 min of the suite: benchmarks/cluster_chaos.py
# runs it (three runs in a row), `make test` the way back on the node left.
@pytest.mark.parametrize("back", ["out-of-service", benchmark_only("node-returns")])
def test_a_lost_node_costs_no_restart_and_the_job_ends_with_the_uninterrupted_weights(
    reallab: DevCluster, back: str, request: pytest.FixtureRequest
) -> None:
    name = f"lost-{back.split('-')[0]}"
    doc = real_job(name, 2, 1)
    doc["spec"]["workload"] = {**WORKLOAD, "steps": STEPS, "logEvery": 10}
    doc["spec"]["checkpoint"]["everySteps"] = EVERY
    submit(reallab, doc)
    with BoundPods(reallab, TENANT, name) as seen:
        pod_0, pod_1 = pods_after_first_checkpoint(reallab, name)
        lost = pod_0["spec"]["nodeName"]
        t_kill = time.time()
        crash = reallab.gpufleet("cluster", "crash-node", lost, "--dir", str(reallab.dir))
        request.addfinalizer(lambda: restore(reallab, lost))  # for the tests after this one
        assert crash.returncode == 0, crash.stderr
        at_kill = checkpoint_step(checkpoints(reallab, name)[-1])
        survivor = pod_1["metadata"]["name"]
        poll_until(lambda: exit_code(seen.pods.get(survivor, pod_1)) is not None,
                   what="the surviving pod to exit", timeout=300)  # fmt: skip
        t_survivor = time.time()
        said = pod_log(reallab, survivor, tail_lines=50)
        assert LOST_HOST.search(said), said  # the launcher's reason, in its pod's log
        poll_until(lambda: not node_ready(reallab, lost), what=f"{lost} NotReady", timeout=120)
        t_not_ready = time.time()
        t_evicted = bring_back(reallab, lost, pod_0, back)
        poll_until(lambda: progressed(reallab, name, at_kill), what="a step after the resume",
                   timeout=300)  # fmt: skip
        t_step = time.time()
        phase, _ = reallab.run_to_end(name, TENANT, timeout=600)
    logs = reallab.gpufleet("logs", name, "-n", TENANT).stdout
    assert phase == "Succeeded", logs[-3000:]
    assert exit_code(seen.pods[survivor]) == 75, seen.pods[survivor]["status"]
    job = reallab.typed("BatchV1Api").read_namespaced_job_status(name, TENANT).status
    assert not job.failed, job  # neither the lost pod nor the survivor's exit 75 counted
    placed = {p["spec"]["nodeName"] for n, p in seen.pods.items() if n not in (survivor,
              pod_0["metadata"]["name"])}  # fmt: skip
    if back == "out-of-service":
        assert lost not in placed, placed  # the job went on without the lost node
    local = local_digest(reallab.root, 2, 1, STEPS, EVERY)
    assert digests_in_logs(reallab, name) == [local]
    kept = kept_logs_once_pods_are_gone(reallab, name)
    assert DIGEST.findall(kept) == [local]
    restore(reallab, lost)
    record(
        f"node-loss-{back}",
        kill_to_survivor_exit_s=t_survivor - t_kill,
        kill_to_not_ready_s=t_not_ready - t_kill,
        kill_to_evicted_s=t_evicted - t_kill,
        kill_to_first_step_s=t_step - t_kill,
    )
    assert reallab.cancel(name, TENANT)
