"""Ray jobs here (spec.framework ray): `gpufleet run` starts a Ray cluster of `ray start`
processes (a head and two nodes) and runs the digits workload with Ray Train's TorchTrainer.
Exactness as docs/frameworks.md defines it for Ray: a run whose Train worker is killed, which
Ray restarts from the last checkpoint, ends with the uninterrupted run's weights, bit for bit;
a corrupt checkpoint is set aside and the one before it resumed."""

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

from gpufleet.errors import EXIT_NO_CHECKPOINT
from tests.support import refcache
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.procs import poll_until
from tests.support.specs import write_spec

# Looked for, never imported: Ray runs in the job's processes only.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None,
        reason="needs the ray extra: pip install 'gpufleet[ray]'",
    ),
]

STEPS, EVERY = 300, 50


def ray_spec(name: str, steps: int = STEPS) -> dict[str, Any]:
    return {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "framework": "ray",
            "nodes": 2,
            "workload": {"name": "digits", "steps": steps, "batchSize": 32, "logEvery": 50},
            "checkpoint": {"everySteps": EVERY, "keep": 2},
            "maxRestarts": 2,
        },
    }


def run(workdir: Path, name: str, steps: int = STEPS) -> subprocess.Popen[str]:
    spec = write_spec(workdir, ray_spec(name, steps), f"{name}.yaml")
    return subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=workdir,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def summary(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, json.loads(out), err


def checkpoints(workdir: Path, name: str) -> Path:
    return workdir / ".gpufleet" / "runs" / name / "checkpoints"


def checkpoint_done(workdir: Path, name: str, step: int) -> bool:
    return any(checkpoints(workdir, name).glob(f"step_{step:09d}-*/COMPLETE.json"))


def train_workers(launcher: int) -> list[psutil.Process]:
    """The Ray Train workers of the run ``launcher`` started (its Ray nodes' descendants)."""
    found = []
    for proc in psutil.Process(launcher).children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run's summary: a reference run, once per session and machine, and
    not at all when an earlier session ran it with the same sources and packages
    (tests/support/refcache.py)."""

    def whole() -> dict[str, Any]:
        code, result, err = summary(run(tmp_path_factory.mktemp("ray-uninterrupted"), "ray-whole"))
        assert code == 0 and result["restarts"] == 0, err[-3000:]
        return result

    return refcache.reference(ray_spec("ray-whole"), whole)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run whose Train worker is SIGKILLed once its first checkpoint is written."""
    workdir = tmp_path_factory.mktemp("ray-killed")
    proc = run(workdir, "ray-killed")
    poll_until(lambda: checkpoint_done(workdir, "ray-killed", EVERY), what=f"checkpoint {EVERY}",
               alive=proc, timeout=240)  # fmt: skip
    workers = train_workers(proc.pid)
    assert len(workers) == 2, workers
    workers[-1].send_signal(signal.SIGKILL)
    code, result, err = summary(proc)
    assert code == 0, err[-3000:]
    result["workdir"] = workdir
    return result


def test_two_ray_nodes_train_digits_to_the_expected_accuracy(killed: dict[str, Any]) -> None:
    assert killed["status"] == "Succeeded"
    assert killed["steps"] == STEPS
    assert killed["accuracy"] >= 0.9, killed
    root = checkpoints(killed["workdir"], "ray-killed")
    # Ray kept spec.checkpoint.keep of them, each with gpufleet's marker.
    assert len(list(root.glob("step_*"))) == 2, sorted(p.name for p in root.iterdir())
    checked = subprocess.run(gpufleet_cmd("checkpoints", "verify", str(root)), env=cli_env(),
                             capture_output=True, text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("OK") == 2, checked.stdout


def test_a_killed_train_worker_is_restarted_by_ray_and_the_job_ends_exact(
    killed: dict[str, Any], uninterrupted: dict[str, Any]
) -> None:
    assert killed["restarts"] >= 1, killed
    assert killed["resumed_from"] is not None and killed["resumed_from"] >= EVERY, killed
    assert killed["state_digest"] == uninterrupted["state_digest"]


def test_a_corrupt_checkpoint_is_set_aside_and_the_one_before_resumed(
    workdir: Path, killed: dict[str, Any]
) -> None:
    # The killed run's checkpoints (steps 250 and 300, the uninterrupted run's weights), under
    # its job's name here: a copy, not a run of its own (a Ray cluster's start is most of a
    # run's time).
    name, kept = "ray-killed", checkpoints(killed["workdir"], "ray-killed")
    shutil.copytree(kept, checkpoints(workdir, name))
    (newest,) = checkpoints(workdir, name).glob(f"step_{STEPS:09d}-*")
    state = newest / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped, the size kept
    state.write_bytes(bytes(data))
    code, second, err = summary(run(workdir, name, steps=STEPS + EVERY))
    assert code == 0, err[-3000:]
    assert second["resumed_from"] == STEPS - EVERY, second
    assert "is corrupt" in err and newest.name in err, err[-3000:]
    # Every checkpoint corrupt: no restart can fix it, so Ray does not retry it, and the run
    # ends with worker 0's error and its exit code (not Ray's "gave up after its restarts").
    for state in checkpoints(workdir, name).glob("step_*/state.pt"):
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    code, third, err = summary(run(workdir, name, steps=STEPS + 2 * EVERY))
    assert code == EXIT_NO_CHECKPOINT and third["status"] == "Failed", err[-3000:]
    assert "no usable checkpoint" in third["message"], third
    assert "Error count" not in err, err[-3000:]  # Ray Train's restarts


RAY_SCRIPT = """
import os, sys
import ray
ray.init()  # RAY_ADDRESS: the job's cluster

@ray.remote(num_cpus=1)
def square(x):
    return x * x

print("sum", sum(ray.get([square.remote(i) for i in range(10)])))
sys.exit(int(sys.argv[1]))
"""


def test_a_command_is_the_driver_of_the_jobs_ray_cluster(workdir: Path) -> None:
    """A user's Ray script runs once, as the driver; its failure is the job's, with its
    last lines. (A driver's success is the job's: the built-in workload's driver above; a
    script that writes no result may succeed: tests/unit/test_launch_summary.py.)"""
    (workdir / "script.py").write_text(RAY_SCRIPT)
    command = {"framework": "ray", "nodes": 2, "command": ["script.py", "3"]}
    doc = {"apiVersion": "gpufleet.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "ray-cmd"}, "spec": command}  # fmt: skip
    spec = write_spec(workdir, doc, "cmd.yaml")
    done = subprocess.run(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=workdir,
                          env=cli_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    result = json.loads(done.stdout)
    assert "sum 285" in done.stderr + done.stdout, done.stderr[-3000:]
    assert done.returncode == 1 and result["status"] == "Failed", result
    assert "Ray driver ended with exit code 3" in result["message"], result
    assert "sum 285" in result["message"], result
