"""The rendered pod's own command and environment, run on this machine.

``gpufleet render`` gives each worker pod ``python -m gpufleet.launch.pod <torchrun options>``.
These tests take that command and env from the rendered Indexed Job, move the pod's paths and
the rendezvous host onto this machine, and check what the kubelet and Prometheus will see: the
job's metrics on the spec's port while it trains, exit 0 when done, 75 when SIGTERM arrives
(after the preemption checkpoint), 1 when a worker fails past its restarts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from gpufleet.net import free_port
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.conftest import cli_env, cluster_job, poll_until
from tests.scrape import scrape_port, steps_by_rank

pytestmark = pytest.mark.slow


def pod_process(
    workdir: Path, *, faults: str = "", **spec: Any
) -> tuple[subprocess.Popen[str], int]:
    """Start the rendered worker pod's command here; returns it and its metrics port."""
    port = free_port()
    job = validate_training_job(
        cluster_job(nodes=1, procsPerNode=2, metrics={"port": port}, **spec)
    )
    (_, indexed) = render(job, "job")
    (container,) = indexed["spec"]["template"]["spec"]["containers"]
    rdzv = f"{job.metadata.name}-0.{job.metadata.name}:29400"
    here = f"127.0.0.1:{free_port()}"
    command = [
        sys.executable if a == "python" else a.replace(rdzv, here) for a in container["command"]
    ]
    assert command[1:3] == ["-m", "gpufleet.launch.pod"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (
        env["GPUFLEET_METRICS_PORT"] == str(port) and env["GPUFLEET_METRICS_ADDRESS"] == "0.0.0.0"
    )
    # The pod's emptyDir and volume, moved here; listen on loopback only on a shared machine.
    env.update(
        GPUFLEET_RUN_DIR=str(workdir / "run"),
        PROMETHEUS_MULTIPROC_DIR=str(workdir / "run" / "metrics"),
        GPUFLEET_CHECKPOINT_DIR=str(workdir / "ckpt"),
        GPUFLEET_METRICS_ADDRESS="127.0.0.1",
    )
    if faults:
        env["GPUFLEET_FAULTS"] = faults
    proc = subprocess.Popen(
        command, cwd=workdir, env={**cli_env(), **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return proc, port


def wait_for_steps(proc: subprocess.Popen[str], port: int, at_least: int) -> dict[str, float]:
    def stepped() -> dict[str, float] | None:
        steps = steps_by_rank(scrape_port(port)[1])
        return steps if set(steps) == {"0", "1"} and min(steps.values()) >= at_least else None

    what = f"step {at_least} from both ranks on :{port}"
    return poll_until(stepped, what=what, alive=proc, retry_on=(OSError,))


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def test_pod_serves_job_metrics_and_exits_0(workdir: Path) -> None:
    proc, port = pod_process(workdir, workload={"name": "digits", "steps": 200, "logEvery": 10})
    steps = wait_for_steps(proc, port, 5)
    _, samples = scrape_port(port)
    assert samples["gpufleet_job_hang_timeout_seconds"][0][1] > 0
    code, out = finish(proc)
    assert code == EXIT_OK, out
    assert max(steps.values()) <= 200
    assert (workdir / "run" / "result.json").exists()


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


def test_pod_worker_failure_past_restarts_exits_1(workdir: Path) -> None:
    proc, _ = pod_process(
        workdir, faults="exit@step=3,rank=1", maxRestarts=0,
        workload={"name": "digits", "steps": 50, "logEvery": 10},
    )  # fmt: skip
    code, out = finish(proc)
    assert code == EXIT_FAILED, out
    assert "gpufleet:" in out and "rank" in out.lower()
