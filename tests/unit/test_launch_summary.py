"""`gpufleet run`'s summary of its nodes' outcomes (gpufleet.launch.local._summarize) and the
rank logs a failure quotes: no worker, a run directory written by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.launch import local
from gpufleet.launch.fatal import write_fatal
from gpufleet.launch.logs import last_lines_of_rank, rank_log_files
from gpufleet.launch.node import NodeOutcome
from gpufleet.runtime.rundir import RunDir
from gpufleet.spec import TrainingJob, validate_training_job
from tests.support.specs import digits_job


def job(**spec: Any) -> TrainingJob:
    return validate_training_job(digits_job("fresh-job", **spec))


def rank_files(node: Path, attempt: int, stderr: str | None, stdout: str | None) -> Path:
    where = node / "train_x1" / f"attempt_{attempt}" / "0"
    where.mkdir(parents=True)
    for name, text in (("stderr.log", stderr), ("stdout.log", stdout)):
        if text is not None:
            (where / name).write_text(text)
    os.utime(where, (1_700_000_000, 1_700_000_000))  # same time: the attempt number decides
    return where


def test_the_newest_attempts_stderr_is_read_else_its_stdout(tmp_path: Path) -> None:
    assert rank_log_files(tmp_path, 0) == [] and last_lines_of_rank(tmp_path, 0) is None
    rank_files(tmp_path, 0, "old failure\n", None)
    newest = rank_files(tmp_path, 1, "\n  \n", "step 1\nstep 2\n\nstep 3\n")
    assert rank_log_files(tmp_path, 0) == [newest / "stderr.log", newest / "stdout.log"]
    assert last_lines_of_rank(tmp_path, 0, n=2) == (
        str(newest / "stdout.log"),
        ["step 2", "step 3"],
    )
    (newest / "stdout.log").write_text(" \n")
    assert last_lines_of_rank(tmp_path, 0) is None  # nothing but blank lines


def outcome(**kw: Any) -> NodeOutcome:
    return NodeOutcome(exit_code=kw.pop("exit_code", 1), **kw)


@pytest.mark.parametrize(("code", "what"), [(-9, "signal SIGKILL"), (-40, "signal 40"),
                                            (3, "exit code 3")])  # fmt: skip
def test_a_failed_rank_is_named_with_how_it_ended_and_its_last_lines(
    tmp_path: Path, code: int, what: str
) -> None:
    rank_files(RunDir(tmp_path).node_logs(0), 0, "Traceback\nValueError: bad\n", None)
    summary = local._summarize(job(), tmp_path, [outcome(failed_rank=1, failed_local_rank=0,
                                                         failed_exitcode=code)], 0.0)  # fmt: skip
    assert (summary.status, summary.exit_code, summary.restarts) == ("Failed", 1, 2)
    log = RunDir(tmp_path).node_logs(0) / "train_x1" / "attempt_0" / "0" / "stderr.log"
    assert summary.message == (f"job fresh-job failed: rank 1 ended with {what} after 2 restart(s) "
                               f"(spec.maxRestarts)\nlast lines of rank 1 ({log}):\n  Traceback\n"
                               "  ValueError: bad")  # fmt: skip


def test_a_drivers_own_failure_message_is_kept_and_a_rank_without_logs_has_no_tail(
    tmp_path: Path,
) -> None:
    said = outcome(failed_message="ray: driver raised ValueError")
    assert local._summarize(job(), tmp_path, [said], 0.0).message == said.failed_message
    rank_0 = local._summarize(job(), tmp_path, [outcome(failed_rank=0, failed_exitcode=1)], 0.0)
    assert rank_0.message == ("job fresh-job failed: rank 0 ended with exit code 1 after 2 "
                              "restart(s) (spec.maxRestarts)")  # fmt: skip


def test_a_fatal_error_wins_and_a_signal_is_a_preemption_only_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    files = RunDir(tmp_path)
    files.result.write_text(json.dumps({"steps": 40, "metrics": {"accuracy": 0.9, "f1": 0.8}}))
    ok = local._summarize(job(), tmp_path, [outcome(exit_code=0)], 0.0)
    assert (ok.status, ok.steps, ok.accuracy, ok.extra) == ("Succeeded", 40, 0.9, {"f1": 0.8})
    stopped = [outcome(exit_code=143, signal=15)]
    interrupted = local._summarize(job(), tmp_path, stopped, 0.0)
    assert (interrupted.status, interrupted.exit_code) == ("Interrupted", 143)
    assert interrupted.message == "stopped by SIGTERM before a preemption checkpoint was confirmed"
    files.preempted.write_text(json.dumps({"step": 30, "checkpoint": "step_30"}))
    preempted = local._summarize(job(), tmp_path, stopped, 0.0)
    assert (preempted.status, preempted.exit_code) == ("Preempted", 75)
    assert preempted.message.startswith("preempted at step 30 after checkpoint step_30; run the")
    write_fatal(tmp_path, 4, "every checkpoint is corrupt", 0)
    fatal = local._summarize(job(), tmp_path, [outcome()], 0.0)
    assert (fatal.status, fatal.exit_code) == ("Failed", 4)
    assert fatal.message == "job fresh-job failed: every checkpoint is corrupt"


def test_a_builtin_workload_that_ends_without_a_result_failed_and_a_script_may(
    tmp_path: Path,
) -> None:
    """Workers of a built-in workload that exit 0 without result.json did not train (the
    module ran no main, say): Failed, not Succeeded with no steps. A user's script writes no
    result.json of gpufleet's, and succeeds."""
    untrained = local._summarize(job(), tmp_path, [outcome(exit_code=0)], 0.0)
    assert (untrained.status, untrained.exit_code, untrained.steps) == ("Failed", 1, None)
    assert untrained.message == (
        "job fresh-job failed: its workers exited 0 without a result (result.json): "
        "the built-in workload ended without training"
    )
    script = validate_training_job(digits_job("script", workload=None, command=["train.py"]))
    ran = local._summarize(script, tmp_path, [outcome(exit_code=0)], 0.0)
    assert (ran.status, ran.exit_code, ran.message) == ("Succeeded", 0, None)


def test_the_launcher_of_several_local_nodes_does_not_import_torch() -> None:
    """`gpufleet run` of several nodes runs each node's agent in a process of its own: the CLI
    imported torch anyway, through gpufleet.launch.node, 2.4 CPU-s of every such run."""
    code = "import sys, gpufleet.cli.main, gpufleet.launch.local; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
