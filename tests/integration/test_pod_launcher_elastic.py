"""An elastic job growing, as its pods do on a cluster (issue 56, item 2), run here: the rendered
pod's command for a queued job of range 1-2 in exact mode (its rendezvous' last call 5 s). Pod 0
starts alone, trains at one worker and, once it reported step 30, holds at step 31 (a ``pause``
fault: on a fast host it would end its 400 steps before pod 1's Python has started); pod 1 then
joins (the elastic controller grew the Job, Kueue admitted the new slice). torchrun's membership
change stops pod 0's worker: the SIGTERM ends its pause, it checkpoints at the next step, and the
group starts again at two workers from that step, without a restart of maxRestarts. Both pods end
0 with the weights of one worker run without a resize, bit for bit (on real nodes with Kueue:
tests/cluster/test_realnodes_elastic.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import EXIT_OK
from gpufleet.net import free_port
from tests.support.podlauncher import finish, kill_left, pod_process, wait_for_steps

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {
    "nodes": 2, "minNodes": 1, "procsPerNode": 1, "maxRestarts": 1, "queue": "research",
    "parallelism": {"exactAcrossWorldSizes": True, "shards": 2},
    "workload": {"name": "digits", "steps": 400, "logEvery": 100},
    "checkpoint": {"dir": "/ckpt/run", "everySteps": 10},
}  # fmt: skip


def test_a_pod_joining_grows_the_group_from_a_checkpoint_with_exact_weights(
    workdir: Path,
) -> None:
    straight = workdir / "straight"
    straight.mkdir()
    alone, _ = pod_process(straight, rdzv_conf="is_host=true",
                           **{**SPEC, "nodes": 1, "minNodes": None})  # fmt: skip
    try:
        code, _ = finish(alone)
    finally:
        kill_left([alone])
    assert code == EXIT_OK
    grown = workdir / "grown"
    grown.mkdir()
    here = f"127.0.0.1:{free_port()}"
    first, port = pod_process(grown, node=0, here=here, rdzv_conf="is_host=true",
                              faults="pause@step=31", **SPEC)  # fmt: skip
    pods = [first]
    try:
        wait_for_steps(first, port, 30, ranks={"0"})
        pods.append(pod_process(grown, node=1, here=here,
                                rdzv_conf="is_host=false", **SPEC)[0])  # fmt: skip
        results = [finish(p) for p in pods]
    finally:
        kill_left(pods)
    assert [code for code, _ in results] == [EXIT_OK, EXIT_OK], results
    log = results[0][1]
    preempted = re.findall(r"gpufleet: preempted at step (\d+)", log)
    resumed = re.findall(r"gpufleet: resumed from step (\d+)", log)
    assert len(preempted) == 1 and resumed == preempted, log[-3000:]
    assert "resuming with 2" in log, log[-3000:]
    # the stop was the group's own, no preemption of the pod: nothing says so afterwards
    assert not list(grown.glob("run*/preempted.json"))
    summaries = [json.loads(p.read_text()) for p in (*straight.glob("run*/result.json"),
                                                     *grown.glob("run*/result.json"))]  # fmt: skip
    assert len(summaries) == 2 and summaries[0]["state_digest"] == summaries[1]["state_digest"]
