"""Tiered checkpoints (spec.checkpoint.durable): the loop saves to the fast tier, the node's
uploader copies each committed checkpoint to the durable tier, verified, its marker last; a
resume takes the newest copy that verifies on either tier. The durable tier is a real S3 server
(versitygw, on 127.0.0.1) and, for the PVC case, a local directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.durable import Uploader, tiers
from gpufleet.runtime.files import read_json
from gpufleet.runtime.integrity import MARKER
from gpufleet.runtime.metrics import (
    DURABLE_LAG_SECONDS,
    DURABLE_LAG_STEPS,
    DURABLE_STEP,
    UPLOAD_FAILURES,
)
from tests.support.chaos import straight_run
from tests.support.cli import cli_env, gpufleet_cmd, run_cli, summary_of
from tests.support.podlauncher import finish as finish_pod
from tests.support.podlauncher import pod_process
from tests.support.procs import poll_until
from tests.support.s3 import S3, bucket_env, needs_versitygw
from tests.support.scrape import scrape_port
from tests.support.specs import digits_job, write_spec

pytestmark = [pytest.mark.slow, needs_versitygw]

JOB = "tiers"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """versitygw with bucket 'durable', in this process's environment (s3fs reads it)."""
    with bucket_env(tmp_path_factory.mktemp("s3"), "durable") as server:
        yield server


def state(step: int, size: int = 64) -> dict[str, Any]:
    return {"m": {"w": torch.full((size, size), float(step))}}


def loaded(ckpt: Checkpointer, size: int = 64) -> tuple[int | None, str | None, float]:
    into = state(0, size)
    ref = ckpt.load_latest(into)
    return (ref.step if ref else None, ref.tier if ref else None, float(into["m"]["w"][0, 0]))


def two_tiers(fast: Path, durable: str, keep: int = 2) -> tuple[Checkpointer, Uploader]:
    identity = {"job": JOB}
    ckpt = Checkpointer(str(fast), keep=3, identity=identity, durable=durable)
    f, d = tiers(str(fast), durable, JOB)
    return ckpt, Uploader(f, d, keep=keep)


def test_uploads_are_verified_marker_last_and_retention_is_the_durable_tiers(
    tmp_path: Path, s3: S3
) -> None:
    ckpt, up = two_tiers(tmp_path / "fast", "s3://durable/a", keep=2)
    for step in (5, 10):  # 5 is superseded before any upload: never durable
        ckpt.save(step, state(step))
    assert up.pass_once() is not None
    for step in (15, 20):
        ckpt.save(step, state(step))
        assert up.pass_once() is not None
    fs = s3.fs()
    durable = sorted(fs.ls("durable/a"))
    assert [p.rsplit("/", 1)[-1][:14] for p in durable] == ["step_000000015", "step_000000020"]
    newest_fast = ckpt.complete()[-1].path
    for name in (p.name for p in Path(newest_fast).iterdir()):  # every file, byte for byte
        assert fs.cat_file(f"{durable[-1]}/{name}") == (Path(newest_fast) / name).read_bytes()
    final = up.stop()
    assert final.newest_durable == 20 and final.uploaded == [10, 15, 20]
    assert final.never_durable == [5] and final.error is None and final.lag_steps() == 0


def test_a_corrupt_fast_copy_resumes_from_the_durable_one(tmp_path: Path, s3: S3) -> None:
    lines: list[str] = []
    ckpt, up = two_tiers(tmp_path / "fast", "s3://durable/b")
    ckpt._log = lines.append  # the warnings it logs are the subject here
    for step in (5, 10):
        ckpt.save(step, state(step))
        up.pass_once()
    newest = Path(ckpt.complete()[-1].path)
    shard = max((p for p in newest.iterdir() if p.name != MARKER), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert loaded(ckpt) == (10, "durable", 10.0)  # the same step, from the other tier
    assert any("step 10 is corrupt" in ln and shard.name in ln for ln in lines), lines
    assert Path(f"{newest}.corrupt").is_dir()  # set aside, never deleted


def test_a_wiped_fast_tier_resumes_from_the_durable_one(tmp_path: Path, s3: S3) -> None:
    ckpt, up = two_tiers(tmp_path / "fast", "s3://durable/c")
    ckpt.save(5, state(5))
    up.pass_once()
    ckpt.save(10, state(10))  # committed on the fast tier only: lost with it
    shutil.rmtree(tmp_path / "fast")
    assert loaded(ckpt) == (5, "durable", 5.0)


def test_a_half_uploaded_checkpoint_is_never_loaded_and_the_next_pass_completes_it(
    tmp_path: Path, s3: S3
) -> None:
    """What an uploader killed mid-file leaves: some files, one of them cut short, no marker.
    A resume skips it for the older complete copy; the next uploader uploads it again, whole."""
    ckpt, up = two_tiers(tmp_path / "fast", "s3://durable/d", keep=5)
    ckpt.save(5, state(5, 256))
    up.pass_once()
    ckpt.save(10, state(10, 256))
    src = Path(ckpt.complete()[-1].path)
    fs = s3.fs()
    files = sorted(p for p in src.iterdir() if p.name != MARKER)
    assert len(files) >= 2
    for f in files:
        data = f.read_bytes()
        fs.pipe_file(f"durable/d/{src.name}/{f.name}", data[: len(data) // 2])  # cut
    node = tmp_path / "node"
    shutil.move(tmp_path / "fast", node)  # the node is lost: the durable copy of 10 is torn
    reader = Checkpointer(str(tmp_path / "fast"), identity={"job": JOB}, durable="s3://durable/d")
    assert loaded(reader, 256) == (5, "durable", 5.0)
    shutil.rmtree(tmp_path / "fast")  # the reader's new, empty one
    shutil.move(node, tmp_path / "fast")  # (the node came back) the next pass uploads it whole
    assert up.pass_once() is not None
    assert loaded(reader, 256)[:2] == (10, "fast")
    shutil.rmtree(src)
    assert loaded(reader, 256) == (10, "durable", 10.0)


def test_a_corrupt_fast_file_is_not_made_durable_nor_costs_the_older_durable_copy(
    tmp_path: Path, s3: S3
) -> None:
    """A fast copy that no longer matches its marker (bit rot after the commit) is refused by
    the upload, loudly, rather than copied and called durable; durable retention (keep 1) runs
    only after a verified upload, so the older durable copy, now the only verified one, stays."""
    ckpt, up = two_tiers(tmp_path / "fast", "s3://durable/e", keep=1)
    ckpt.save(5, state(5))
    assert up.pass_once() is not None
    ckpt.save(10, state(10))
    src = Path(ckpt.complete()[-1].path)
    shard = max((p for p in src.iterdir() if p.name != MARKER), key=lambda p: p.stat().st_size)
    shard.write_bytes(b"rot" + shard.read_bytes()[3:])
    assert up.pass_once() is None
    assert up.state.error and "does not match its marker" in up.state.error
    fs = s3.fs()
    assert not fs.exists(f"durable/e/{src.name}/{MARKER}")
    assert [
        p.rsplit("/", 1)[-1][:14] for p in fs.ls("durable/e") if fs.exists(f"{p}/{MARKER}")
    ] == ["step_000000005"]
    shutil.rmtree(tmp_path / "fast")
    assert loaded(ckpt) == (5, "durable", 5.0)


def test_a_directory_durable_tier(tmp_path: Path) -> None:
    """The durable tier on a mounted volume (a PVC) rather than an object store."""
    ckpt, up = two_tiers(tmp_path / "fast", str(tmp_path / "pvc"))
    ckpt.save(5, state(5))
    assert up.pass_once() is not None
    shutil.rmtree(tmp_path / "fast")
    assert loaded(ckpt) == (5, "durable", 5.0)


# ---- whole jobs --------------------------------------------------------------------------
LONG = {"name": "digits", "steps": 200, "batchSize": 32, "logEvery": 1}


def tiered_job(name: str, durable: str, **spec: Any) -> dict[str, Any]:
    checkpoint = {"dir": "fast", "everySteps": 20, "keep": 2, "durable": {"dir": durable}}
    return digits_job(name, workload=LONG, checkpoint=checkpoint, **spec)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return straight_run(tmp_path_factory, "baseline", digits_job("straight", workload=LONG))


def start_run(
    workdir: Path, name: str, env: dict[str, str]
) -> tuple[Path, Path, subprocess.Popen[str]]:
    """`gpufleet run` of a tiered job ``name`` (durable tier s3://durable/job-<name>) in the
    background: its spec, its run directory and the launcher."""
    spec = write_spec(workdir, tiered_job(name, f"s3://durable/job-{name}"), f"{name}.yaml")
    launcher = subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=workdir,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    return spec, workdir / ".gpufleet" / "runs" / name, launcher


def durable_state(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / "durable.json") or {}


def test_preempted_job_waits_for_its_upload_then_resumes_exactly_from_the_durable_tier(
    workdir: Path, s3: S3, baseline: dict[str, Any]
) -> None:
    """SIGTERM: the preemption checkpoint is uploaded within the grace period before the
    launcher exits; the fast tier is then wiped (a lost node) and the next run resumes from the
    durable tier and ends with the uninterrupted run's weights."""
    env = {**cli_env(), **s3.env}
    spec, run_dir, launcher = start_run(workdir, "preempt", env)
    poll_until(lambda: (read_json(run_dir / "progress.json") or {}).get("step", 0) >= 30,
               what="step 30", alive=launcher, interval=0.05)  # fmt: skip
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == EXIT_PREEMPTED, err[-3000:]
    first = summary_of(subprocess.CompletedProcess([], 0, out, err))
    stopped = read_json(run_dir / "preempted.json")["step"]
    assert first["durable"]["complete"] and first["durable"]["newest"] == stopped, first
    shutil.rmtree(workdir / "fast")
    again = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    s = summary_of(again)
    assert s["resumed_from"] == stopped and "durable tier" in again.stderr
    assert s["state_digest"] == baseline["state_digest"]
    assert s["durable"]["newest"] == LONG["steps"] and s["durable"]["complete"]


def test_a_bucket_outage_mid_run_does_not_stop_training(
    workdir: Path, s3: S3, baseline: dict[str, Any]
) -> None:
    """The object store goes away after the first upload: training goes on, the failures show
    in the uploader's state and the log, and once the store is back the last checkpoint
    reaches it before the job ends."""
    _, run_dir, launcher = start_run(workdir, "outage", {**cli_env(), **s3.env})
    try:
        poll_until(lambda: durable_state(run_dir).get("newest_durable"), what="a durable copy",
                   alive=launcher, interval=0.05)  # fmt: skip
        s3.stop()
        failing = poll_until(lambda: durable_state(run_dir).get("failures"),
                             what="a failed upload", alive=launcher)  # fmt: skip
        assert failing >= 1
    finally:
        s3.start()
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    s = summary_of(subprocess.CompletedProcess([], 0, out, err))
    assert s["state_digest"] == baseline["state_digest"]  # training never noticed
    assert s["durable"]["complete"] and s["durable"]["newest"] == LONG["steps"], s["durable"]
    assert "WARNING durable tier" in err


# ---- a pod's launcher --------------------------------------------------------------------
def pod_with_tiers(workdir: Path, s3: S3, prefix: str, **spec: Any) -> tuple[Any, int]:
    checkpoint = {"dir": "/ckpt/run", "everySteps": 5, "durable": {"dir": f"s3://{prefix}"}}
    workload = {"name": "digits", "steps": 5000, "logEvery": 50}
    return pod_process(workdir, workload=workload, checkpoint=checkpoint, extra_env=s3.env, **spec)


def test_a_pod_serves_the_durable_lag_and_uploads_its_preemption_checkpoint(
    workdir: Path, s3: S3
) -> None:
    proc, port = pod_with_tiers(workdir, s3, "durable/pod-a")
    durable = poll_until(lambda: scrape_port(port)[1].get(DURABLE_STEP), what="durable series",
                         alive=proc, retry_on=(OSError,))  # fmt: skip
    assert durable[0][0] == {"job_name": "train"} and durable[0][1] >= 5
    _, samples = scrape_port(port)
    assert {DURABLE_LAG_STEPS, DURABLE_LAG_SECONDS, f"{UPLOAD_FAILURES}_total"} <= set(samples)
    os.kill(proc.pid, signal.SIGTERM)
    code, out = finish_pod(proc)
    assert code == EXIT_PREEMPTED, out
    stopped = read_json(workdir / "run" / "preempted.json")["step"]
    fs = s3.fs()
    complete = [p for p in fs.ls("durable/pod-a") if fs.exists(f"{p}/{MARKER}")]
    assert max(int(p.rsplit("step_", 1)[1][:9]) for p in complete) == stopped, out[-3000:]


def test_a_pod_whose_grace_period_ends_before_the_upload_says_so(workdir: Path, s3: S3) -> None:
    proc, port = pod_with_tiers(workdir, s3, "durable/pod-b", preemption={"gracePeriod": "6s"})
    poll_until(lambda: scrape_port(port)[1].get(DURABLE_STEP), what="durable series",
               alive=proc, retry_on=(OSError,))  # fmt: skip
    s3.stop()
    try:
        os.kill(proc.pid, signal.SIGTERM)
        code, out = finish_pod(proc)  # its 120 s limit: the grace's wait, not the final 600 s
    finally:
        s3.start()
    assert code == EXIT_PREEMPTED, out
    stopped = read_json(workdir / "run" / "preempted.json")["step"]
    assert f"the checkpoint of step {stopped} did not reach the durable tier" in out, out[-3000:]
