"""A RayJob on the real nodes (issue 30, item 2): gpufleet's RayJob, admitted by Kueue with the
chart's lab values, its RayCluster made by the real KubeRay operator from the project's image
(KubeRay's `ray start` in pods that pass `restricted`), the driver submitted to the head's
dashboard by the operator through the API server's service proxy, Ray Train's two workers on
the two nodes checkpointing as UID 1000 to the shared claim; the last checkpoint holds the very
weights a local `gpufleet run` of the same Ray job ends with, and the cluster is gone after."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.frameworks.ray.train import STATE, state_digest
from gpufleet.runtime.integrity import MARKER
from tests.support.devcluster import DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT, real_job
from tests.support.references import WORKLOAD, local_digest
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip


def ray_why(cluster: DevCluster, name: str, pods: dict[str, dict[str, Any]]) -> str:
    """What a RayJob that did not succeed says: its status and the pods seen."""
    rayjob = cluster.custom.get_namespaced_custom_object("ray.io", "v1", TENANT, "rayjobs", name)
    seen = {n: p["status"].get("phase") for n, p in pods.items()}
    return f"{rayjob.get('status')}\n{seen}"


def test_a_rayjob_trains_digits_on_real_nodes_and_ends_with_the_local_runs_weights(
    reallab: DevCluster,
) -> None:
    import torch

    name = "ray-rayjob-2x1"
    doc = real_job(name, 2, 1, "ray")
    # 3 of a node's 4 GPUs per worker: the two cannot share a node (the scheduler alone once
    # packed them onto one, beside the head on the other); the Train workers use CPUs here
    doc["spec"]["resources"]["gpu"] = 3
    # 5 s for the Ray cluster's pods to end once KubeRay deletes them (digits_job's 20 s): the
    # wait for the cluster to be gone below is at most that
    doc["spec"]["preemption"] = {"gracePeriod": "5s"}
    path = write_spec(reallab.root, doc, f"{name}.yaml")
    submit = reallab.gpufleet("submit", str(path), "--target", "rayjob")
    assert submit.returncode == 0, submit.stderr[-2000:]
    phase, pods = reallab.run_to_end(name, TENANT, timeout=480)
    assert phase == "Succeeded", ray_why(reallab, name, pods)
    workers = [p for p in pods.values() if p["metadata"]["labels"].get("ray.io/node-type")
               == "worker"]  # fmt: skip
    assert len({p["spec"]["nodeName"] for p in workers}) == 2, [p["spec"] for p in workers]
    steps = WORKLOAD["steps"]
    (last,) = (reallab.dir / "volumes").glob(f"pv-*/{name}/step_{steps:09d}-*")
    assert (last / MARKER).is_file(), sorted(p.name for p in last.iterdir())
    assert all(p.stat().st_uid == 1000 for p in last.iterdir())
    state = torch.load(last / STATE, weights_only=True)
    assert state_digest(state["model"]) == local_digest(reallab.root, 2, 1, framework="ray")
    # shutdownAfterJobFinishes: KubeRay deletes the cluster once the job ended
    poll_until(lambda: not reallab.pods(TENANT, name), what=f"{name}'s Ray cluster gone",
               timeout=120)  # fmt: skip
    assert reallab.cancel(name, TENANT)
