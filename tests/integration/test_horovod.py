"""Horovod jobs here (spec.framework horovod): a user's unmodified Horovod PyTorch script in the
style of Horovod's examples (examples/horovod_digits.py), on two workers started by the elastic
agents, over Horovod's Gloo controller. A rank killed mid-run restarts the group, the script
resumes from its own checkpoint, and the job ends with the weights of an uninterrupted run under
Horovod's own launcher (horovodrun --gloo), bit for bit."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.horovodrun import SCRIPT, WORKERS, horovodrun_reference, script_args
from tests.support.procs import poll_until, processes_mentioning
from tests.support.specs import write_spec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("horovod") is None,
        reason="needs Horovod built for this torch: scripts/build-horovod.sh install .venv "
        "(make test does)",
    ),
]


def horovod_spec(name: str, workdir: Path) -> dict[str, Any]:
    args = script_args(str(workdir / "ckpt"), str(workdir / "result.json"))
    return {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"framework": "horovod", "command": [str(SCRIPT), *args], "nodes": WORKERS,
                 "maxRestarts": 2},
    }  # fmt: skip


@pytest.fixture(scope="module")
def horovodrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return horovodrun_reference(tmp_path_factory.mktemp("horovodrun"))


def rank(process: psutil.Process) -> str | None:
    """A worker's torchrun rank (None for a process that is not one, or gone meanwhile)."""
    try:
        return process.environ().get("RANK")
    except psutil.Error:
        return None


def test_a_killed_rank_restarts_the_group_and_the_script_resumes_exact(
    tmp_path: Path, horovodrun: dict[str, Any]
) -> None:
    spec = write_spec(tmp_path, horovod_spec("horovod-killed", tmp_path), "job.yaml")
    proc = subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=tmp_path,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        poll_until(lambda: (tmp_path / "ckpt" / "checkpoint-1.pth.tar").exists(),
                   what="the script's checkpoint of epoch 1", alive=proc, timeout=180)  # fmt: skip
        victims = [p for p in processes_mentioning(str(SCRIPT), cwd=tmp_path) if rank(p) == "1"]
        assert len(victims) == 1, victims
        victims[0].send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # a failed step above: its launcher, with its agents
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["status"] == "Succeeded"
    killed = json.loads((tmp_path / "result.json").read_text())
    assert killed["size"] == horovodrun["size"] == 2
    assert killed["resumed_from_epoch"] >= 1, killed
    assert "resumed from epoch" in err
    assert killed["digest"] == horovodrun["digest"], (killed, horovodrun)
