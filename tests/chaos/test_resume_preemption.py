"""Chaos: training preempted or killed from outside, while it runs (seconds long, so that the
signal lands mid-run): a worker SIGKILLed, the launcher sent SIGTERM or SIGINT (it checkpoints,
exits 75 and resumes where it stopped), and a preemption the workers cannot honour in their
grace period. The final weights equal an uninterrupted run's (``long_baseline``) bit for bit.
The random choices come from GPUFLEET_CHAOS_SEED (tests/support/chaos.py).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.runtime.context import PREEMPTED_FILE
from gpufleet.runtime.files import read_json
from tests.support.chaos import RNG, SEED, rank_logs, straight_run
from tests.support.cli import cli_env, gpufleet_cmd, run_cli, summary_of
from tests.support.procs import poll_until, workers_in
from tests.support.specs import digits_job, write_spec

pytestmark = pytest.mark.slow

LONG_STEPS = 400
LONG_WORKLOAD = {"name": "digits", "steps": LONG_STEPS, "batchSize": 32, "logEvery": 1}


@pytest.fixture(scope="module")
def long_baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run long enough (seconds) to be interrupted from outside reliably."""
    doc = digits_job("long", workload=LONG_WORKLOAD)
    return straight_run(tmp_path_factory, "long-baseline", doc)


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen[str]) -> int:
    def reached() -> int | None:
        progress = read_json(run_dir / "progress.json")
        return int(progress["step"]) if progress and progress["step"] >= step else None

    return poll_until(reached, what=f"training to reach step {step}", alive=proc, interval=0.05)


def test_external_sigkill_of_a_worker(workdir: Path, long_baseline: dict[str, Any]) -> None:
    spec = write_spec(workdir, digits_job("victim", workload=LONG_WORKLOAD))
    launcher = subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=workdir,
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    _wait_for_step(workdir / ".gpufleet/runs/victim", RNG.randint(2, 30), launcher)
    workers = workers_in(workdir)
    assert len(workers) == 2
    RNG.choice(workers).send_signal(signal.SIGKILL)
    out, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, err[-3000:]
    s = summary_of(subprocess.CompletedProcess([], 0, out, err))
    assert s["restarts"] == 1
    assert s["state_digest"] == long_baseline["state_digest"], f"seed {SEED}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_preempt_launcher_then_resume(
    workdir: Path, long_baseline: dict[str, Any], sig: signal.Signals
) -> None:
    spec = write_spec(workdir, digits_job("preempt", workload=LONG_WORKLOAD))
    launcher = subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=workdir,
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    run_dir = workdir / ".gpufleet/runs/preempt"
    _wait_for_step(run_dir, RNG.randint(3, 30), launcher)
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == EXIT_PREEMPTED, err[-3000:]
    first = summary_of(subprocess.CompletedProcess([], 0, out, err))
    assert first["status"] == "Preempted" and "run the same command again" in first["message"]
    stopped_at = read_json(run_dir / "preempted.json")["step"]
    assert 0 < stopped_at < LONG_STEPS
    assert not workers_in(workdir)

    again = run_cli("run", str(spec), "-o", "json", cwd=workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    s = summary_of(again)
    assert s["resumed_from"] == stopped_at
    assert s["launches"] == 2
    assert s["state_digest"] == long_baseline["state_digest"], f"seed {SEED}"


def test_grace_period_runs_out_without_a_checkpoint(workdir: Path) -> None:
    """A preemption the workers cannot honour ends as a plain kill: rank 1 hangs (injected), so
    no rank reaches the step boundary where the preemption checkpoint is taken; after the 2 s
    grace the launcher SIGKILLs them, exits 128+SIGTERM (not 75: nothing to resume from) and
    leaves no preemption marker and no worker behind. The grace path that ends in 75 is
    test_preempt_launcher_then_resume."""
    doc = digits_job("grace", workload=LONG_WORKLOAD, preemption={"gracePeriod": "2s"})
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "hang@step=3,rank=1"
    launcher = subprocess.Popen(gpufleet_cmd("run", str(write_spec(workdir, doc))), cwd=workdir,
                                env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    run_dir = workdir / ".gpufleet/runs/grace"
    poll_until(lambda: "gpufleet-fault: hang" in rank_logs(workdir, "grace"),
               what="the injected hang", alive=launcher)  # fmt: skip
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert not (run_dir / PREEMPTED_FILE).exists()
    # the workdir fixture fails the test if any worker outlives the launcher
