"""TensorFlow jobs here (spec.framework tensorflow): two workers under
MultiWorkerMirroredStrategy over loopback, started by the elastic agents as PyTorch workers
are. Exactness as docs/frameworks.md defines it for TensorFlow: a run whose worker is killed,
or that is preempted and run again, ends with the uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpufleet.errors import EXIT_PREEMPTED
from tests.support import refcache
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.procs import poll_until, processes_mentioning
from tests.support.specs import write_spec

# Looked for, never imported: TensorFlow in the test process beside torch crashed a later
# torch import (a segfault loading triton); the workers are processes of their own.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None,
        reason="needs the tensorflow extra: pip install 'gpufleet[tensorflow]'",
    ),
]

STEPS, EVERY = 300, 50


def tf_spec(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "framework": "tensorflow",
            "nodes": 2,
            "workload": {"name": "digits", "steps": STEPS, "batchSize": 32, "logEvery": 50},
            "checkpoint": {"everySteps": EVERY, "keep": 2},
            "maxRestarts": 2,
        },
    }


def run(workdir: Path, name: str, *extra: str) -> subprocess.Popen[str]:
    spec = write_spec(workdir, tf_spec(name), f"{name}.yaml")
    return subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json", *extra), cwd=workdir,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def summary(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, json.loads(out), err


def checkpoint_done(workdir: Path, name: str, step: int) -> bool:
    root = workdir / ".gpufleet" / "runs" / name / "checkpoints"
    return any(root.glob(f"step_{step:09d}-*/COMPLETE.json"))


def run_to_first_checkpoint(workdir: Path, name: str) -> subprocess.Popen[str]:
    """``gpufleet run`` of the job ``name``, once its first checkpoint is complete."""
    proc = run(workdir, name)
    poll_until(lambda: checkpoint_done(workdir, name, EVERY), what=f"checkpoint {EVERY}",
               alive=proc, timeout=180)  # fmt: skip
    return proc


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run's summary: a reference run, once per session and machine, and
    not at all when an earlier session ran it with the same sources and packages
    (tests/support/refcache.py)."""

    def whole() -> dict[str, Any]:
        code, result, err = summary(run(tmp_path_factory.mktemp("tf-uninterrupted"), "tf-whole"))
        assert code == 0 and result["restarts"] == 0, err[-3000:]
        return result

    return refcache.reference(tf_spec("tf-whole"), whole)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run whose rank 1 is SIGKILLed once the first checkpoint is complete; its agent's
    scratch directory (autograph's modules) is gone with the agent."""
    workdir = tmp_path_factory.mktemp("tf-killed")
    proc = run_to_first_checkpoint(workdir, "tf-killed")
    victims = [p for p in processes_mentioning("gpufleet.frameworks.tf", cwd=workdir)
               if p.environ().get("RANK") == "1"]  # fmt: skip
    assert len(victims) == 1, victims
    # Its $TMPDIR is its agent's, where autograph's modules stay when a worker is killed.
    scratch = Path(victims[0].environ()["TMPDIR"])
    assert any(scratch.glob("__autograph_generated_file*.py")), list(scratch.iterdir())
    victims[0].send_signal(signal.SIGKILL)
    code, result, err = summary(proc)
    assert code == 0, err[-3000:]
    assert not scratch.exists(), "the agent's scratch directory outlived it"
    result["workdir"] = workdir
    return result


def test_two_workers_train_digits_to_the_expected_accuracy(killed: dict[str, Any]) -> None:
    assert killed["status"] == "Succeeded"
    assert killed["steps"] == STEPS
    assert killed["accuracy"] >= 0.9, killed
    logs = Path(killed["run_dir"])
    if not logs.is_absolute():
        logs = killed["workdir"] / logs
    assert sorted(p.name for p in (logs / "logs").iterdir()) == ["node0", "node1"]
    # Its checkpoints carry gpufleet's markers: the same verifier reads them.
    checked = subprocess.run(gpufleet_cmd("checkpoints", "verify", str(logs / "checkpoints")),
                             env=cli_env(), capture_output=True, text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("OK") == 2, checked.stdout


def test_a_killed_worker_restarts_the_group_and_the_job_ends_exact(
    killed: dict[str, Any], uninterrupted: dict[str, Any]
) -> None:
    assert killed["resumed_from"] is not None and killed["resumed_from"] >= EVERY, killed
    assert killed["state_digest"] == uninterrupted["state_digest"]


def test_a_preempted_job_exits_75_and_resumes_exact_from_the_agreed_step(
    workdir: Path, uninterrupted: dict[str, Any]
) -> None:
    proc = run_to_first_checkpoint(workdir, "tf-preempted")
    psutil.Process(proc.pid).send_signal(signal.SIGTERM)
    code, first, err = summary(proc)
    assert code == EXIT_PREEMPTED and first["status"] == "Preempted", err[-3000:]
    stopped = first["steps"]
    assert EVERY <= stopped < STEPS
    assert checkpoint_done(workdir, "tf-preempted", stopped)  # both workers stopped there
    code, second, err = summary(run(workdir, "tf-preempted"))
    assert code == 0, err[-3000:]
    assert second["resumed_from"] == stopped
    assert second["state_digest"] == uninterrupted["state_digest"]


def test_a_corrupt_checkpoint_is_set_aside_and_another_jobs_is_refused(
    workdir: Path, killed: dict[str, Any], uninterrupted: dict[str, Any]
) -> None:
    """A flipped byte in the newest TensorFlow checkpoint: the next run sets it aside, resumes
    from the one before and still ends exact. Another job pointed at the same directory is
    refused with exit 2 before it trains."""
    # The killed run's checkpoints (steps 250 and 300, the uninterrupted run's weights), its
    # job's: a copy, not a run.
    shared = workdir / "ckpt"
    shutil.copytree(killed["workdir"] / ".gpufleet/runs/tf-killed/checkpoints", shared)
    doc = tf_spec("tf-killed")
    doc["spec"]["checkpoint"]["dir"] = str(shared)
    spec = write_spec(workdir, doc, "corrupt.yaml")
    cmd = gpufleet_cmd("run", str(spec), "-o", "json")
    (newest,) = shared.glob(f"step_{STEPS:09d}-*")
    (data,) = newest.glob("ckpt.data-*")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    again = subprocess.run(cmd, cwd=workdir, env=cli_env(), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout)
    assert result["resumed_from"] == STEPS - EVERY, result
    assert result["state_digest"] == uninterrupted["state_digest"]
    assert f"checkpoint step {STEPS} is corrupt" in again.stdout + again.stderr
    assert list(shared.glob(f"step_{STEPS:09d}-*.corrupt"))
    other = tf_spec("tf-intruder")
    other["spec"]["checkpoint"]["dir"] = str(shared)
    cmd = gpufleet_cmd("run", str(write_spec(workdir, other, "o.yaml")))
    intruder = subprocess.run(cmd, cwd=workdir, env=cli_env(), capture_output=True, text=True)
    assert intruder.returncode == 2, intruder.stderr[-3000:]
    assert "belongs to job tf-killed, not tf-intruder" in intruder.stderr
