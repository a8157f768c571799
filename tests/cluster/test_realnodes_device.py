"""A GPU lost mid-run on real pods (issue 29, item 7), as far as a machine without GPUs allows:
rank 1's CUDA call raises as on a GPU that fell off the bus (GPUFLEET_FAULTS `device`:
torch.AcceleratorError, "unspecified launch failure"), and the GPU exporter on its node (the
chart's DaemonSet, simulated GPUs) is told its GPU 0 fell off the bus (SIGUSR1: XID 79, reads
fail). The job restarts inside its pods, resumes from the shared claim's checkpoint and ends
with the uninterrupted run's weights; the cluster's Prometheus, with gpufleet's rules, fires
GpufleetGpuXidHardware naming that node and GPU, and nothing for the other node. The true
device path (a real device-side error on NCCL) stays a `gpu` test (tests/integration/)."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest

from gpufleet.devcluster.platform import FAILING, SIMULATED_GPUS
from gpufleet.runtime.faults import ENV_FAULTS
from tests.support.devcluster import DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import (
    DIGEST,
    TENANT,
    digests_in_logs,
    pod_log,
    processes_in_pod,
    prometheus,
    real_job,
    record,
    running_pod,
)
from tests.support.references import LONG, WORKLOAD, local_digest
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(600)]  # fmt: skip
NAME, FAULT_STEP = "device-lost", 120
STEPS, EVERY = LONG
SYSTEM = "gpufleet-system"  # the chart's release namespace (tests/support/realnodes.py)
ALERT = "GpufleetGpuXidHardware"


def exporter_pid(cluster: DevCluster, node: str) -> int:
    """The host pid of `gpufleet exporter` in the exporter pod on ``node`` (by its cgroup)."""
    listed = cluster.core.list_namespaced_pod(
        SYSTEM, label_selector="app.kubernetes.io/component=exporter",
        field_selector=f"spec.nodeName={node}")  # fmt: skip
    (pod,) = listed.items
    pids = processes_in_pod(pod.metadata.uid, b"exporter")
    assert pids, f"no exporter process in pod {pod.metadata.name}"
    return pids[0]


def firing(cluster: DevCluster) -> list[dict[str, str]]:
    """The labels of every firing GpufleetGpuXidHardware alert."""
    found = prometheus(cluster, "query", query=f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}')
    return [r["metric"] for r in found]


def gpus_reported(cluster: DevCluster, node: str) -> dict[str, float]:
    """gpufleet_gpu_up of each simulated GPU of ``node``, as Prometheus scraped it."""
    found = prometheus(cluster, "query", query=f'gpufleet_gpu_up{{node="{node}"}}')
    return {r["metric"]["gpu"]: float(r["value"][1]) for r in found}


def all_reported(cluster: DevCluster, node: str) -> dict[str, float] | None:
    up = gpus_reported(cluster, node)
    return up if len(up) == SIMULATED_GPUS else None


def submit(cluster: DevCluster) -> None:
    doc = real_job(NAME, 2, 1)
    doc["spec"]["workload"] = {**WORKLOAD, "steps": STEPS, "logEvery": 100}
    doc["spec"]["checkpoint"]["everySteps"] = EVERY
    doc["spec"]["env"] = {ENV_FAULTS: f"device@step={FAULT_STEP},rank=1"}
    done = cluster.gpufleet("submit", str(write_spec(cluster.root, doc, f"{NAME}.yaml")),
                            "--target", "job")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def fault_seen(cluster: DevCluster) -> tuple[dict[str, Any], float] | None:
    """Pod 1 and when its log said the fault fired."""
    pod = running_pod(cluster, NAME, 1)
    if pod is None or "gpufleet-fault: device" not in pod_log(cluster, pod["metadata"]["name"]):
        return None
    return pod, time.time()


def test_a_lost_gpu_restarts_the_group_resumes_exactly_and_pages_for_its_node(
    reallab: DevCluster,
) -> None:
    nodes = [n.metadata.name for n in reallab.core.list_node().items]
    for node in nodes:  # the exporters are scraped, every GPU up, no page yet

        def all_up(n: str = node) -> dict[str, float] | None:
            # a read past the exporter's 2 s deadline (a loaded machine) reads as down for
            # one scrape: wait for every GPU up, as the fault must find them
            up = all_reported(reallab, n)
            return up if up and set(up.values()) == {1.0} else None

        poll_until(all_up, what=f"{node}'s GPUs up in Prometheus", timeout=120, interval=2)
    assert not firing(reallab)
    submit(reallab)
    pod, fault_at = poll_until(lambda: fault_seen(reallab), what="the device fault", timeout=240,
                               interval=0.5)  # fmt: skip
    node = pod["spec"]["nodeName"]
    os.kill(exporter_pid(reallab, node), signal.SIGUSR1)  # the same GPU, seen by the exporter
    gpu, xid = (str(v) for v in FAILING)
    alerts = poll_until(lambda: firing(reallab), what=f"{ALERT} firing", timeout=120, interval=1)
    alerted = time.time() - fault_at
    assert [(a["node"], a["gpu"], a["xid"]) for a in alerts] == [(node, gpu, xid)], alerts
    assert gpus_reported(reallab, node)[gpu] == 0.0
    phase, pods = reallab.run_to_end(NAME, TENANT, timeout=300)
    logs = reallab.gpufleet("logs", NAME, "-n", TENANT).stdout
    assert phase == "Succeeded", logs[-3000:]
    assert "AcceleratorError: CUDA error: unspecified launch failure" in logs, logs[-3000:]
    assert re.search(rf"resumed from step {FAULT_STEP // EVERY * EVERY}\b", logs), logs[-3000:]
    assert "made no step progress" not in logs  # the failing rank left at once (no hang)
    assert len([n for n in pods if n.startswith(f"{NAME}-1-")]) == 1, pods.keys()  # in-pod
    local = local_digest(reallab.root, 2, 1, STEPS, EVERY)
    assert digests_in_logs(reallab, NAME) == [local] and DIGEST.search(logs)
    record("device", fault_to_alert_s=alerted)
    reallab.gpufleet("cancel", NAME, "-n", TENANT)
    poll_until(lambda: not reallab.pods(TENANT, NAME), what=f"{NAME}'s pods gone", timeout=60)
