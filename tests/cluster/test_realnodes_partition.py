"""A network partition between the two real nodes mid-run (issue 29, item 3): every packet
between their pods dropped (`gpufleet cluster partition`), the nodes themselves Ready all along.
The collective the ranks are in cannot complete; their hang watchdogs (spec.hangTimeout) end
them, the workers restart, and once the link heals (`gpufleet cluster heal`) the job resumes
from its last checkpoint and ends with the weights of the same job run here without
interruption; `gpufleet status` says in one line what happened. Two heals:

- ``short``: healed as soon as the watchdog fired; the pods' agents restart their workers and
  meet again: no pod is replaced.
- ``long``: healed only once pod 1 gave the rendezvous host up (gpufleet.launch.hostwatch: exit
  75, not counted); its replacement, on the same node (each pod takes 3 of a node's 4 GPUs),
  joins pod 0 and the job goes on without spending maxRestarts.

The timings (partition to detection, against hangTimeout) are recorded where $GPUFLEET_RECORD
names a file (benchmarks/cluster_chaos.py)."""

from __future__ import annotations

import re
import time

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
    log_time,
    node_ready,
    pod_log,
    pods_after_first_checkpoint,
    real_job,
    record,
    submit,
)
from tests.support.references import PARTITIONED, WORKLOAD, local_digest

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip

(STEPS, EVERY), HANG_S = PARTITIONED, 10
HUNG = re.compile(r"gpufleet: rank (\d) made no step progress for ([\d.]+)s")
LOST_HOST = re.compile(r"gpufleet: lost the rendezvous host")
RESUMED = re.compile(r"resumed from step (\d+)")
# what `status` says after the restart (gpufleet.cluster.progress.restart_note)
SAID = re.compile(
    rf"restarted: 1 worker restarts?, ranks? [01](, 1)? hung after step (\d+) \(no step within "
    rf"hangTimeout {HANG_S} s\), resumed from step (\d+)"
)


def partition(cluster: DevCluster, nodes: list[str], cut: bool) -> None:
    verb = "partition" if cut else "heal"
    done = cluster.gpufleet("cluster", verb, *nodes, "--dir", str(cluster.dir))
    assert done.returncode == 0, done.stderr


def status_line(cluster: DevCluster, name: str) -> str | None:
    """`gpufleet status`'s line, once it tells the restart (the resumed ranks report it)."""
    said = cluster.gpufleet("status", name, "-n", TENANT)
    return said.stdout if said.returncode == 0 and SAID.search(said.stdout) else None


def submit_split(cluster: DevCluster, name: str) -> None:
    """A 2-pod job, one pod per node (each takes 3 of a node's 4 GPUs), with a short
    hangTimeout and its metrics port (what `status` reads, through the API server)."""
    doc = real_job(name, 2, 1)
    doc["spec"]["resources"] = {"gpu": 3}
    doc["spec"]["hangTimeout"] = f"{HANG_S}s"
    doc["spec"]["workload"] = {**WORKLOAD, "steps": STEPS, "logEvery": 10}
    doc["spec"]["checkpoint"]["everySteps"] = EVERY
    doc["spec"]["metrics"] = {"port": 9410}
    submit(cluster, doc)


@pytest.mark.parametrize("heal", ["short", benchmark_only("long")])
def test_a_partition_is_detected_by_the_hang_watchdog_and_the_job_resumes_exactly_once_healed(
    reallab: DevCluster, heal: str, request: pytest.FixtureRequest
) -> None:
    name = f"split-{heal}"
    submit_split(reallab, name)
    with BoundPods(reallab, TENANT, name) as seen:
        pod_0, pod_1 = pods_after_first_checkpoint(reallab, name)
        nodes = [pod_0["spec"]["nodeName"], pod_1["spec"]["nodeName"]]
        assert nodes[0] != nodes[1], nodes
        t_cut = time.time()
        partition(reallab, nodes, cut=True)
        request.addfinalizer(lambda: partition(reallab, nodes, cut=False))
        t_hung = poll_until(lambda: log_time(reallab, HUNG, name), what="a hang watchdog",
                            timeout=120, interval=0.5)  # fmt: skip
        survivor = pod_1["metadata"]["name"]
        if heal == "long":
            poll_until(lambda: exit_code(seen.pods.get(survivor, pod_1)) is not None,
                       what="pod 1 to give the rendezvous host up", timeout=180)  # fmt: skip
            assert LOST_HOST.search(pod_log(reallab, survivor, tail_lines=50))
        assert all(node_ready(reallab, node) for node in nodes)  # a partition, not a lost node
        newest = checkpoint_step(checkpoints(reallab, name)[-1])
        t_heal = time.time()
        partition(reallab, nodes, cut=False)
        said = poll_until(lambda: status_line(reallab, name), what="status to tell the restart",
                          timeout=300, interval=1)  # fmt: skip
        t_said = time.time()
        phase, _ = reallab.run_to_end(name, TENANT, timeout=600)
    logs = reallab.gpufleet("logs", name, "-n", TENANT).stdout
    assert phase == "Succeeded", logs[-3000:]
    idle = [float(s) for _, s in HUNG.findall(logs)]
    assert idle and all(HANG_S <= s < HANG_S + 2 for s in idle), idle  # detected on time
    told = SAID.search(said)
    assert told is not None and ", pods 2/2 Running;" in said, said
    hung_after, resumed = int(told.group(2)), int(told.group(3))
    assert resumed == newest <= hung_after, said  # the last checkpoint
    assert [int(r) for r in RESUMED.findall(logs)] == [resumed], RESUMED.findall(logs)
    job = reallab.typed("BatchV1Api").read_namespaced_job_status(name, TENANT).status
    assert not job.failed, job  # no restart of the Job's counted
    replaced = sorted(n for n in seen.pods if n not in (pod_0["metadata"]["name"], survivor))
    if heal == "short":
        assert not replaced and "replaced:" not in said, replaced  # the agents met again
    else:
        assert exit_code(seen.pods[survivor]) == 75, seen.pods[survivor]["status"]
        assert f"replaced: pod {survivor} (exit 75: preempted or lost its rendezvous" in said
        assert [seen.pods[n]["spec"]["nodeName"] for n in replaced] == [nodes[1]], replaced
    local = local_digest(reallab.root, 2, 1, STEPS, EVERY)
    assert digests_in_logs(reallab, name) == [local]
    assert DIGEST.findall(kept_logs_once_pods_are_gone(reallab, name)) == [local]
    record(f"partition-{heal}", hang_timeout_s=HANG_S, cut_to_detected_s=t_hung - t_cut,
           watchdog_idle_s=max(idle), cut_to_heal_s=t_heal - t_cut,
           heal_to_status_said_s=t_said - t_heal)  # fmt: skip
    assert reallab.cancel(name, TENANT)
