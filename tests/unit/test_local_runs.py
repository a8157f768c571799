"""`gpufleet jobs` without a cluster: the runs under a run root, their state from their lock
(held only while `gpufleet run` lives) and the files the launcher and rank 0 keep."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.launch import runs
from gpufleet.launch.lock import job_lock
from gpufleet.launch.runs import local_runs
from gpufleet.runtime.rundir import ARCHIVE_DIR, RunDir
from tests.support.runs import run_dir


def test_finished_interrupted_and_never_launched_runs(tmp_path: Path) -> None:
    t = time.time() - 600
    run_dir(tmp_path, "done", launches=[{"started": t, "status": "Failed", "restarts": 3},
                                        {"started": t + 60, "status": "Succeeded", "restarts": 1}],
            result={"steps": 300, "final_loss": 0.0328}, locked_at=t + 59)  # fmt: skip
    # Locked after its last recorded launch and no longer held: killed before it could record.
    run_dir(tmp_path, "killed", launches=[{"started": t, "status": "Preempted", "restarts": 0}],
            progress={"step": 40, "steps": 100, "loss": 0.5}, locked_at=t + 300)  # fmt: skip
    run_dir(tmp_path, "empty")
    (tmp_path / ARCHIVE_DIR / "done-20261120").mkdir(parents=True)  # --fresh's: not a run
    got = {r.name: r for r in local_runs(tmp_path)}
    assert sorted(got) == ["done", "empty", "killed"]
    done, killed, empty = got["done"], got["killed"], got["empty"]
    assert (done.state, done.step, done.steps, done.loss) == ("Succeeded", 300, 300, 0.0328)
    assert (done.restarts, done.launches, done.eta_seconds) == (4, 2, None)
    assert (killed.state, killed.step, killed.steps, killed.launches) == ("Interrupted", 40, 100, 2)
    assert (empty.state, empty.step, empty.started) == ("Unknown", None, None)


def test_a_run_holding_its_lock_is_running_with_its_time_to_go(tmp_path: Path) -> None:
    run_dir(tmp_path, "live", launches=[{"started": 1.0, "status": "Preempted", "restarts": 2}],
            progress={"step": 40, "steps": 100, "loss": 0.4, "step_seconds": 0.5,
                      "restart_count": 1})  # fmt: skip
    with job_lock(tmp_path, "live", None):  # as `gpufleet run` takes it (this process's PID)
        progress = RunDir(tmp_path / "live").progress
        progress.write_text(progress.read_text())  # rank 0 reports after the run started
        (live,) = local_runs(tmp_path)
        assert (live.state, live.step, live.loss, live.eta_seconds) == ("Running", 40, 0.4, 30.0)
        assert (live.restarts, live.launches) == (2 + 1, 2)
    (after,) = local_runs(tmp_path)
    assert after.state == "Interrupted"  # it ran after launch 1, and is gone


def test_a_run_refused_after_taking_its_lock_is_not_interrupted(tmp_path: Path) -> None:
    """Another job's checkpoint directory, a busy port: the run took its own lock, then
    stopped before running; the last launch's outcome stands."""
    run_dir(tmp_path, "digits", launches=[{"started": 1.0, "status": "Succeeded", "restarts": 0}],
            progress={"step": 9, "steps": 9}, locked_at=time.time() + 5)  # fmt: skip
    (refused,) = local_runs(tmp_path)
    assert (refused.state, refused.launches) == ("Succeeded", 1)


def test_without_proc_locks_the_holders_pid_stands_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs, "PROC_LOCKS", tmp_path / "no-such-file")
    run_dir(tmp_path, "mine", progress={"step": 1}, locked_at=time.time() - 5)  # this PID: alive
    assert local_runs(tmp_path)[0].state == "Running"
    info = json.loads((tmp_path / "mine.lock").read_text())
    (tmp_path / "mine.lock").write_text(json.dumps({**info, "pid": 2**22 + 1}))  # no process
    assert local_runs(tmp_path)[0].state == "Interrupted"


def test_no_run_root_is_no_runs(tmp_path: Path) -> None:
    assert local_runs(tmp_path / "absent") == []


def test_the_cli_lists_local_runs_without_a_cluster(tmp_path: Path) -> None:
    t = time.time() - 7200
    run_dir(tmp_path, "digits", launches=[{"started": t, "status": "Succeeded", "restarts": 0}],
            result={"steps": 300, "final_loss": 0.0328}, locked_at=t - 1)  # fmt: skip
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path), "COLUMNS": "80"}
    result = CliRunner().invoke(app, ["jobs", "--run-root", str(tmp_path)], env=env)
    assert result.exit_code == 0, result.output
    assert "no cluster (no kubeconfig found" in result.stderr
    assert result.stdout.split("\n")[1].split() == ["digits", "Succeeded", "300/300", "0.0328",
                                                    "0", "2h", "ago"]  # fmt: skip
    data = json.loads(CliRunner().invoke(app, ["jobs", "--local", "--run-root", str(tmp_path),
                                               "-o", "json"]).stdout)  # fmt: skip
    assert data["runs"][0]["state"] == "Succeeded" and data["runs"][0]["runDir"].endswith("digits")
    empty = CliRunner().invoke(app, ["jobs", "--local", "--run-root", str(tmp_path / "x")])
    assert empty.exit_code == 0 and "no local runs under" in empty.stderr
    asked = CliRunner().invoke(app, ["jobs", "-n", "team-a"], env=env)  # a cluster option
    assert asked.exit_code == 2 and "KUBECONFIG" in asked.stderr and "digits" not in asked.stdout
