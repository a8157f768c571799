"""The rendered pod's own command and environment, run on this machine.

``gpufleet render`` gives each worker pod ``python -m gpufleet.launch.pod <torchrun options>``.
These tests take that command and env from the rendered Indexed Job, move the pod's paths and
the rendezvous host onto this machine, and check what the kubelet and Prometheus will see: the
job's metrics on the spec's port while it trains, exit 0 when done, 75 when SIGTERM arrives
(after the preemption checkpoint), 1 when a worker fails past its restarts, 75 on the other
pods when pod 0 (the rendezvous host) is lost after the group formed, and 1 in one line when no
rendezvous host was ever reachable; and every rank's output in the pod's log and kept beside
the checkpoints when the pod's launcher exits.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import EXIT_FAILED, EXIT_NO_CHECKPOINT, EXIT_OK, EXIT_PREEMPTED
from gpufleet.net import free_port
from tests.support.podlauncher import finish, kill_left, pod_process, wait_for_steps
from tests.support.procs import SHM, semaphores_of
from tests.support.scrape import scrape_port

pytestmark = pytest.mark.slow


def test_pod_serves_job_metrics_and_exits_0(workdir: Path) -> None:
    proc, port = pod_process(workdir, workload={"name": "digits", "steps": 200, "logEvery": 10},
                             checkpoint={"dir": "/ckpt/run", "everySteps": 2})  # fmt: skip
    steps = wait_for_steps(proc, port, 5)
    _, samples = scrape_port(port)
    assert samples["gpufleet_job_hang_timeout_seconds"][0][1] > 0
    assert [value for _, value in samples["gpufleet_job_total_steps"]] == [200, 200]  # per rank
    saved = [value for _, value in samples["gpufleet_job_last_checkpoint_step"]]
    assert saved and all(v >= 2 and v % 2 == 0 for v in saved), saved
    code, out = finish(proc)
    assert code == EXIT_OK, out
    assert max(steps.values()) <= 200
    assert (workdir / "run" / "result.json").exists()
    # every rank's output went to the pod's log and was kept beside the checkpoints at exit
    kept = sorted((workdir / "ckpt" / "logs").glob("*/*/attempt_0/*/std*.log"))
    assert {p.parent.name for p in kept} == {"0", "1"}, kept
    lines = [ln for p in kept for ln in p.read_text().splitlines() if ln.strip()]
    assert lines and all(ln in out for ln in lines), (lines[:5], out[-2000:])


def test_pod_sigterm_checkpoints_and_exits_75(workdir: Path) -> None:
    proc, port = pod_process(
        workdir, workload={"name": "digits", "steps": 5000, "logEvery": 50},
        checkpoint={"dir": "/ckpt/run", "everySteps": 1000},
    )  # fmt: skip
    wait_for_steps(proc, port, 10)
    os.kill(proc.pid, signal.SIGTERM)  # what the kubelet does on preemption or drain
    code, out = finish(proc)
    assert code == EXIT_PREEMPTED, out
    assert "preempted after a checkpoint" in out
    assert (workdir / "run" / "preempted.json").exists()
    assert any((workdir / "ckpt").glob("*/COMPLETE.json")), "no complete preemption checkpoint"
    assert list((workdir / "ckpt" / "logs").glob("*/*/attempt_0/0/stdout.log")), "logs not kept"


def test_a_pod_whose_peer_got_the_sigterm_exits_75_without_a_restart(workdir: Path) -> None:
    """SIGTERM reaches pod 1 only (an eviction deletes the pods one by one; a drain, one node's):
    both ranks stop at the agreed step after the checkpoint, and pod 0's launcher, with a
    restart left and no signal of its own, exits 75 at once. A restarted group would wait for
    a rendezvous that no pod joins (gpufleet.launch.fatal, no_restart_after_fatal)."""
    here = f"127.0.0.1:{free_port()}"
    spec: dict[str, Any] = {
        "nodes": 2, "procsPerNode": 1, "here": here, "maxRestarts": 1,
        "workload": {"name": "digits", "steps": 100000, "logEvery": 50},
        "checkpoint": {"dir": "/ckpt/run", "everySteps": 100000},
    }  # fmt: skip
    host, _ = pod_process(workdir, node=0, rdzv_conf="is_host=true", **spec)
    other, other_port = pod_process(workdir, node=1, rdzv_conf="is_host=false", **spec)
    try:
        wait_for_steps(other, other_port, 5, ranks={"1"})
        os.kill(other.pid, signal.SIGTERM)  # the kubelet's, on pod 1's node only
        code, out = finish(host)
        other_code, other_out = finish(other)
    finally:
        kill_left([host, other])
    assert code == EXIT_PREEMPTED, out
    assert "preempted after a checkpoint" in out and "will restart worker group" not in out, out
    assert other_code == EXIT_PREEMPTED, other_out
    marker = json.loads((workdir / "run" / "preempted.json").read_text())
    assert marker["step"] >= 5 and marker["checkpoint"], marker


def test_pod_worker_failure_past_restarts_exits_1(workdir: Path) -> None:
    proc, _ = pod_process(
        workdir, faults="exit@step=3,rank=1", maxRestarts=0,
        workload={"name": "digits", "steps": 50, "logEvery": 10},
    )  # fmt: skip
    code, out = finish(proc)
    assert code == EXIT_FAILED, out
    assert "gpufleet:" in out and "rank" in out.lower()


def test_losing_the_rendezvous_host_exits_75_on_the_other_pods(workdir: Path) -> None:
    """Two pods of one job; pod 0 (the c10d store's host) is killed as a lost node would be.
    Pod 1 must exit 75 (retriable, free under the Job's pod failure policy) in one line that
    names the host, not 1 with torchrun's traceback, which spent a restart per lost pod 0."""
    here = f"127.0.0.1:{free_port()}"
    spec: dict[str, Any] = {
        "nodes": 2, "procsPerNode": 1, "here": here,
        "workload": {"name": "digits", "steps": 100000, "logEvery": 50},
    }  # fmt: skip
    host, _ = pod_process(workdir, node=0, rdzv_conf="is_host=true", **spec)
    other, other_port = pod_process(workdir, node=1, rdzv_conf="is_host=false", **spec)
    try:
        wait_for_steps(other, other_port, 5, ranks={"1"})  # the group formed and trains
        theirs = semaphores_of(host.pid)
        os.killpg(host.pid, signal.SIGKILL)  # the node of pod 0 is gone
        host.communicate(timeout=30)
        code, out = finish(other)
    finally:
        kill_left([host, other])
    assert code == EXIT_PREEMPTED, out
    # The worker may say first that it lost a peer (gpufleet.launch.shim); the launcher's line:
    (line,) = [x for x in out.splitlines() if "lost the rendezvous host" in x]
    assert line.startswith(f"gpufleet: lost the rendezvous host {here} after the group formed")
    assert "Traceback" not in out[out.index(line) :]
    # The lost node's /dev/shm went with it (the pods' own): the host's holds none of its
    # launcher's semaphores, which its resource tracker, killed with it, never unlinked. (By
    # name: the other xdist worker's killed runs leave theirs in the host's for a while.)
    assert theirs, "pod 0's processes mapped no semaphore: the check would prove nothing"
    assert not theirs & {p.name for p in SHM.glob("sem.*")}


def test_a_pod_that_replaces_a_crashed_one_joins_and_the_job_ends_exact(workdir: Path) -> None:
    """Pod 1 crashes whole (agent and worker: the container's process killed, as on a real
    node) after a checkpoint; the Job's replacement pod 1, a new agent, joins a later round of
    the rendezvous that pod 0's agent still hosts. With torch's shared store it waited for a
    MASTER_ADDR nobody writes (DistStoreError) and the job failed; now both pods end 0 with the
    weights of the same two pods run without a crash."""
    spec: dict[str, Any] = {
        "nodes": 2, "procsPerNode": 1, "maxRestarts": 2,
        "workload": {"name": "digits", "steps": 300, "logEvery": 50},
        "checkpoint": {"dir": "/ckpt/run", "everySteps": 10},
    }  # fmt: skip
    digests = []
    for crash in (False, True):
        where = workdir / ("crash" if crash else "straight")
        where.mkdir()
        here = f"127.0.0.1:{free_port()}"
        started = [pod_process(where, node=n, here=here,
                               rdzv_conf=f"is_host={str(n == 0).lower()}", **spec)
                   for n in (0, 1)]  # fmt: skip
        pods = [proc for proc, _ in started]
        try:
            if crash:
                wait_for_steps(pods[1], started[1][1], 15, ranks={"1"})
                os.killpg(pods[1].pid, signal.SIGKILL)
                pods[1].communicate(timeout=30)
                pods[1] = pod_process(where, node=1, here=here, rdzv_conf="is_host=false",
                                      replacement=1, **spec)[0]  # fmt: skip
            results = [finish(p) for p in pods]
        finally:
            kill_left(pods)
        assert [code for code, _ in results] == [EXIT_OK, EXIT_OK], results
        # Rank 0's run directory: torch's rendezvous ranks the agents by (host, pid), so on one
        # host a replacement whose pid is lower (pids wrap) is rank 0 (its own run directory).
        (result,) = where.glob("run*/result.json")
        summary = json.loads(result.read_text())
        assert (summary.get("resumed_from") is not None) == crash, summary
        digests.append(summary["state_digest"])
    assert digests[0] == digests[1]


def test_a_rendezvous_host_never_reached_exits_1_in_one_line(workdir: Path) -> None:
    """No pod 0 ever answers (a wrong name, a network policy): that is a failure that counts
    (exit 1), or a pod would retry forever for free; one line names the endpoint."""
    here = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc, _ = pod_process(
        workdir, here=here, nodes=2, procsPerNode=1, rdzv_conf="is_host=false,read_timeout=3",
        workload={"name": "digits", "steps": 10},
    )  # fmt: skip
    code, out = finish(proc)
    assert code == EXIT_FAILED, out
    assert f"gpufleet: no rendezvous at {here}:" in out, out
    assert "Traceback" not in out, out


def test_a_pod_waits_for_its_rendezvous_host_as_long_as_the_rendezvous_waits(
    workdir: Path,
) -> None:
    """A pod other than pod 0 (the endpoint names another pod) keeps trying to reach pod 0's
    store for the rendezvous' join_timeout, not torch's 60 s store timeout: pod 0 may itself be
    a replacement still on its way (its node lost). Here no pod 0 ever comes: the pod gives up
    after the join_timeout given (5 s), exit 1, one line."""
    here = f"gpufleet-nohost-0.gpufleet-nohost.invalid:{free_port()}"  # never resolves
    started = time.monotonic()
    proc, _ = pod_process(workdir, here=here, nodes=2, procsPerNode=1, rdzv_conf="join_timeout=5",
                          workload={"name": "digits", "steps": 10})  # fmt: skip
    code, out = finish(proc)
    waited = time.monotonic() - started
    assert code == EXIT_FAILED, out
    assert f"gpufleet: no rendezvous at {here}:" in out, out
    assert "Traceback" not in out, out
    assert 5 <= waited < 55, (waited, out)  # its join_timeout, not torch's 60 s


def test_no_usable_checkpoint_exits_4_without_restarts(workdir: Path) -> None:
    """Every checkpoint on the volume corrupt: the pod exits 4 (a code its pod failure policy
    can tell from a crash) with one line, and torchrun restarts nothing (it restarted the
    group maxRestarts times on the same error, then exited 1)."""
    spec: dict[str, Any] = {
        "procsPerNode": 1, "maxRestarts": 2,
        "workload": {"name": "digits", "steps": 20, "logEvery": 10},
        "checkpoint": {"dir": "/ckpt/run", "everySteps": 10},
    }  # fmt: skip
    proc, _ = pod_process(workdir, **spec)
    code, out = finish(proc)
    assert code == EXIT_OK, out
    for step_dir in (workdir / "ckpt").glob("step_*"):  # not logs/, the kept rank logs
        shard = max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    proc, _ = pod_process(workdir, **spec)
    code, out = finish(proc)
    assert code == EXIT_NO_CHECKPOINT, out
    assert out.count("gpufleet: no usable checkpoint") == 1, out
    assert "Traceback" not in out and "restart" not in out.lower(), out
