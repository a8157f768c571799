"""Job metrics: `gpufleet run` serves every worker's metrics on the spec's port while it runs."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.net import free_port
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.procs import poll_until
from tests.support.scrape import scrape_port, steps_by_rank
from tests.support.specs import digits_job, write_spec

pytestmark = pytest.mark.slow


def test_running_job_exposes_progress_throughput_and_checkpoints(workdir: Path) -> None:
    port = free_port()
    doc = digits_job(
        "metrics",
        workload={"name": "digits", "steps": 300, "batchSize": 16, "logEvery": 5},
        checkpoint={"everySteps": 20, "keep": 2},
        metrics={"port": port},
    )
    proc = subprocess.Popen(
        gpufleet_cmd("run", str(write_spec(workdir, doc))), cwd=workdir, env=cli_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def both_ranks_stepped() -> dict[str, float] | None:
            steps = steps_by_rank(scrape_port(port)[1])
            return steps if set(steps) == {"0", "1"} and min(steps.values()) > 0 else None

        first = poll_until(both_ranks_stepped, what="step metrics from both ranks", alive=proc,
                           retry_on=(OSError,))  # fmt: skip

        def moved_on() -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]] | None:
            text, samples = scrape_port(port)
            later = steps_by_rank(samples)
            ahead = set(later) == {"0", "1"} and min(later.values()) > max(first.values())
            return (text, samples) if ahead and "gpufleet_job_loss" in samples else None

        # the step gauges move on, and the loss appears at the first report
        text, samples = poll_until(moved_on, what="both ranks past their first scraped step",
                                   alive=proc)  # fmt: skip
        later = steps_by_rank(samples)
        assert samples["gpufleet_job_restarts"][0][1] == 0
        assert {v for _, v in samples["gpufleet_job_world_size"]} == {2}  # each rank says 2
        # One scrape reads each rank's files as they are: its samples counter may still be one
        # step behind its step gauge (seen once in a fresh-clone run: 13 steps' samples, step 7+7).
        counted = sum(v for _, v in samples["gpufleet_job_samples_total"])
        assert counted >= 16 * (sum(later.values()) - len(later))
        assert sum(v for _, v in samples["gpufleet_job_step_duration_seconds_count"]) > 0
        assert samples["gpufleet_job_last_progress_timestamp_seconds"][0][1] > time.time() - 60
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=text,
                                   capture_output=True, text=True, check=False)  # fmt: skip
            assert check.returncode == 0, check.stdout + check.stderr
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    with pytest.raises(OSError):
        scrape_port(port)  # the endpoint lives as long as the run


def test_checkpoint_metrics_recorded(workdir: Path) -> None:
    """Checkpoint save and blocking histograms fill as checkpoints commit (read from the files
    the workers leave behind, with prometheus_client's own multiprocess reader)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    doc = digits_job("ckmetrics", checkpoint={"everySteps": 10, "keep": 2},
                     metrics={"port": free_port()})  # fmt: skip
    run = subprocess.run(
        gpufleet_cmd("run", str(write_spec(workdir, doc))), cwd=workdir, env=cli_env(),
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(workdir / ".gpufleet/runs/ckmetrics/metrics"))  # type: ignore[no-untyped-call]
    samples = {
        (s.name, s.labels.get("rank")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    for rank in ("0", "1"):
        # 40 steps, a checkpoint every 10 (the last one synchronous): 4 commits per rank
        assert samples[("gpufleet_job_checkpoint_save_duration_seconds_count", rank)] == 4
        assert samples[("gpufleet_job_checkpoint_blocking_seconds_count", rank)] == 4
        assert samples[("gpufleet_job_steps_total", rank)] == 40
