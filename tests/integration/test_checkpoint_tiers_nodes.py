"""Tiered checkpoints of a job on two nodes whose fast tiers are their own disks: two rendered
worker pods run here (tests/support/podlauncher.py), each with its own fast checkpoint directory
and node name, the durable tier a real S3 server (versitygw). Each node's uploader copies its
ranks' files; node 0's writes the durable marker once both parts are up. A node lost with its
disk (its fast directory wiped) resumes from the durable tier, exactly. The durable copies are
encrypted (spec.checkpoint.durable.encryption): each node seals its own files, node 0's marker
holds both nodes' ciphertext digests, and on the resume each node opens its own plaintext
copy."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import EXIT_OK, EXIT_PREEMPTED
from gpufleet.net import free_port
from gpufleet.runtime.context import ENV_CHECKPOINT_DIR, ENV_NODE_ID
from gpufleet.runtime.encryption import key_id
from gpufleet.runtime.integrity import MARKER
from gpufleet.runtime.sealed import OPENED
from tests.support.podlauncher import finish, kill_left, pod_process
from tests.support.procs import poll_until
from tests.support.s3 import S3, bucket_env, needs_versitygw

pytestmark = [pytest.mark.slow, needs_versitygw]

STEPS = 1500
SPEC: dict[str, Any] = {
    "nodes": 2, "procsPerNode": 1, "maxRestarts": 1,
    "workload": {"name": "digits", "steps": STEPS, "logEvery": 100},
    "checkpoint": {"dir": "/ckpt/run", "everySteps": 100, "durable": {"dir": "s3://durable/job"}},
    "preemption": {"gracePeriod": "60s"},
}  # fmt: skip
KEY = os.urandom(32)


@pytest.fixture(autouse=True)
def key_file(workdir: Path) -> None:
    """The key both pods read (a mounted Secret's file in a real pod)."""
    path = workdir / "checkpoint.key"
    path.write_bytes(KEY)
    SPEC["checkpoint"]["durable"]["encryption"] = {"keyFile": str(path)}


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3]:
    with bucket_env(tmp_path / "s3", "durable") as server:
        yield server


def start_pods(workdir: Path, where: str, s3: S3) -> list[Any]:
    """Both pods of the job, each with its own fast tier (workdir/fast-<n>) and node name."""
    (workdir / where).mkdir()
    here = f"127.0.0.1:{free_port()}"
    return [
        pod_process(workdir / where, node=n, here=here, rdzv_conf=f"is_host={str(n == 0).lower()}",
                    extra_env={**s3.env, ENV_CHECKPOINT_DIR: str(workdir / f"fast-{n}"),
                               ENV_NODE_ID: f"node-{n}"}, **SPEC)[0]
        for n in (0, 1)
    ]  # fmt: skip


def durable_markers(s3: S3) -> dict[int, dict[str, Any]]:
    fs = s3.fs()
    out = {}
    for path in fs.ls("durable/job") if fs.exists("durable/job") else []:
        if fs.exists(f"{path}/{MARKER}"):
            out[int(path.rsplit("step_", 1)[1][:9])] = json.loads(fs.cat_file(f"{path}/{MARKER}"))
    return out


def ended(pods: list[Any]) -> list[tuple[int, str]]:
    try:
        return [finish(p) for p in pods]
    finally:
        kill_left(pods)


def result(workdir: Path, where: str) -> dict[str, Any]:
    """Rank 0's result: in the run directory of the pod whose agent torch ranked first (by
    host, then pid: on one host, pids that wrapped can put pod 1 first)."""
    (found,) = (workdir / where).glob("run*/result.json")
    return dict(json.loads(found.read_text()))


def test_a_node_lost_with_its_disk_resumes_from_the_durable_tier_exactly(
    workdir: Path, s3: S3
) -> None:
    straight = ended(start_pods(workdir, "straight", s3))
    assert [c for c, _ in straight] == [EXIT_OK, EXIT_OK], straight
    markers = durable_markers(s3)
    assert max(markers) == STEPS
    hosts = {f["host"] for f in markers[STEPS]["files"].values()}
    assert hosts == {"node-0", "node-1"}  # each node's ranks wrote, and uploaded, their files
    sealed = markers[STEPS]["encryption"]
    assert (
        sealed["key_id"] == key_id(KEY) and sealed["files"].keys() == markers[STEPS]["files"].keys()
    )
    baseline = result(workdir, "straight")["state_digest"]
    # the same job again, from nothing, preempted after a checkpoint is durable
    for path in [workdir / "fast-0", workdir / "fast-1"]:
        shutil.rmtree(path)
    s3.fs().rm("durable/job", recursive=True)
    pods = start_pods(workdir, "first", s3)
    poll_until(lambda: durable_markers(s3), what="a durable checkpoint", alive=pods[1])
    for proc in pods:
        os.kill(proc.pid, signal.SIGTERM)  # the kubelets' SIGTERM, as a preemption sends it
    first = ended(pods)
    assert [c for c, _ in first] == [EXIT_PREEMPTED, EXIT_PREEMPTED], first
    stopped = json.loads((workdir / "first" / "run" / "preempted.json").read_text())["step"]
    assert max(durable_markers(s3)) == stopped, first[0][1][-3000:]  # both parts up in time
    shutil.rmtree(workdir / "fast-1")  # node 1 is gone; its replacement has an empty disk
    again = ended(start_pods(workdir, "again", s3))
    assert [c for c, _ in again] == [EXIT_OK, EXIT_OK], again
    out = again[0][1]
    assert "split over the nodes' own disks: resuming from the durable tier" in out, out[-3000:]
    final = result(workdir, "again")
    assert final["resumed_from"] == stopped and final["state_digest"] == baseline
    for n in (0, 1):  # each node opened its own copy, and removed it after the load
        assert (workdir / f"fast-{n}" / OPENED).is_dir()
        assert not any((workdir / f"fast-{n}" / OPENED).rglob("*.distcp"))
