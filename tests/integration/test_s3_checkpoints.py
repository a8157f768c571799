"""Checkpoints in an S3 bucket (a real S3 server, versitygw, and moto's stand-in, on 127.0.0.1):
save, purge, resume exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch
from s3fs import S3FileSystem

from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.integrity import MARKER
from tests.support.cli import cli_env, run_cli, summary_of
from tests.support.s3 import VERSITYGW, in_environment, moto, versitygw
from tests.support.specs import digits_job, write_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["versitygw", "moto"])
def s3_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """An S3 server on 127.0.0.1 with bucket 'ckpt', in this process's environment: the real
    one (versitygw) and moto's stand-in; yields the AWS_* variables for it."""
    if request.param == "versitygw" and not VERSITYGW.is_file():
        pytest.skip(f"versitygw not built at {VERSITYGW} (scripts/build-controlplane.sh versitygw)")
    with ExitStack() as stack:
        if request.param == "versitygw":
            server = stack.enter_context(versitygw(tmp_path_factory.mktemp("s3")))
        else:
            server = stack.enter_context(moto())
        stack.enter_context(in_environment(server.env))
        # s3fs keeps one instance per set of arguments: the other server's must not be reused
        stack.callback(S3FileSystem.clear_instance_cache)
        S3FileSystem.clear_instance_cache()
        server.bucket("ckpt")
        yield server.env


@pytest.fixture
def real_s3_env(s3_env: dict[str, str], request: pytest.FixtureRequest) -> dict[str, str]:
    """The real server's variables; the whole-job tests run once, against it."""
    if "moto" in request.node.callspec.id:
        pytest.skip("whole jobs run against the real S3 server only")
    return s3_env


def test_checkpointer_on_s3(s3_env: dict[str, str]) -> None:
    import s3fs

    ckpt = Checkpointer("s3://ckpt/unit", keep=2)
    for step in (5, 10, 15):
        path = ckpt.save(step, {"m": {"w": torch.full((3, 3), float(step))}})
        assert path.startswith("s3://ckpt/unit/step_")
    assert [r.step for r in ckpt.complete()] == [10, 15]
    fs = s3fs.S3FileSystem()
    fs.rm(ckpt.complete()[-1].path.removeprefix("s3://") + "/" + MARKER)  # tear the newest
    into: dict[str, Any] = {"m": {"w": torch.zeros(3, 3)}}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 10
    assert torch.equal(into["m"]["w"], torch.full((3, 3), 10.0))


def test_job_resumes_from_s3(workdir: Path, real_s3_env: dict[str, str]) -> None:
    env = {**cli_env(), **real_s3_env}
    straight = write_spec(workdir, digits_job("s3-straight", checkpoint={"dir": "s3://ckpt/a"}))
    a = run_cli("run", str(straight), "-o", "json", cwd=workdir, env=env)
    assert a.returncode == 0, a.stderr[-3000:]
    env["GPUFLEET_FAULTS"] = "kill@step=25,rank=1"
    chaos = write_spec(workdir, digits_job("s3-chaos", checkpoint={"dir": "s3://ckpt/b"}), "b.yaml")
    b = run_cli("run", str(chaos), "-o", "json", cwd=workdir, env=env)
    assert b.returncode == 0, b.stderr[-3000:]
    sa, sb = summary_of(a), summary_of(b)
    assert sb["restarts"] == 1
    assert sb["checkpoint"].startswith("s3://ckpt/b/step_000000040-")
    assert sa["state_digest"] == sb["state_digest"]


def test_a_corrupt_s3_checkpoint_is_set_aside_and_verify_reads_the_bucket(
    s3_env: dict[str, str],
) -> None:
    """Checksums on S3 as on disk: a changed object makes the resume set that checkpoint aside
    (copied under `.corrupt`, never deleted) and load the previous one; `gpufleet checkpoints
    verify s3://...` reads every object and says which is CORRUPT."""
    import s3fs
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    lines: list[str] = []
    ckpt = Checkpointer("s3://ckpt/rot", keep=5, log=lines.append)
    for step in (5, 10):
        ckpt.save(step, {"m": {"w": torch.full((64, 64), float(step))}})
    fs = s3fs.S3FileSystem()
    newest = ckpt.complete()[-1].path.removeprefix("s3://")
    shard = max(fs.ls(newest, detail=True), key=lambda i: i["size"])["name"]
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(shard, bytes(data))
    verify = CliRunner().invoke(app, ["checkpoints", "verify", "s3://ckpt/rot", "-o", "json"])
    assert verify.exit_code == 1, verify.output
    statuses = [c["status"] for c in json.loads(verify.stdout)["checkpoints"]]
    assert statuses == ["OK", "CORRUPT"]
    into: dict[str, Any] = {"m": {"w": torch.zeros(64, 64)}}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 5
    assert torch.equal(into["m"]["w"], torch.full((64, 64), 5.0))
    assert fs.exists(newest + ".corrupt") and not fs.exists(newest)
    assert any("is corrupt" in ln and shard.rsplit("/", 1)[-1] in ln for ln in lines), lines


def test_bench_training_publishes_to_s3_and_the_collector_reads_it_back(
    workdir: Path, real_s3_env: dict[str, str]
) -> None:
    """A cluster run's pods publish their MLLOG files to S3; `gpufleet bench collect` fetches,
    checks and scores them from there."""
    env = {**cli_env(), **real_s3_env}
    run = run_cli("bench", "training", "--quick", "--results", "s3://ckpt/bench", "--outdir",
                  str(workdir / "a"), "-o", "json", cwd=workdir, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    collected = run_cli("bench", "collect", "s3://ckpt/bench", "--outdir", str(workdir / "b"),
                        "-o", "json", cwd=workdir, env=env)  # fmt: skip
    assert collected.returncode == 0, collected.stderr[-3000:]
    first, second = json.loads(run.stdout), json.loads(collected.stdout)
    assert second["aggregate"]["valid"] and second["aggregate"] == first["aggregate"]
    assert (workdir / "b" / "logs" / "result_0.txt").read_text() == (
        workdir / "a" / "logs" / "result_0.txt"
    ).read_text()
