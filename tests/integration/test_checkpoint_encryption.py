"""Encrypted durable copies (spec.checkpoint.durable.encryption, issue 55 item 2) on a real S3
server (versitygw): the store holds no plaintext, the marker names the key's id and never the
key, a resume decrypts and verifies, a tampered copy is set aside like a corrupt one and the
resume falls back, a missing or wrong key is one error naming the ids, and a whole job
preempted, its fast tier lost, resumes from the encrypted copy and ends exact."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.errors import EXIT_BAD_INPUT, EXIT_PREEMPTED, CheckpointKeyError
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.durable import Uploader, tiers
from gpufleet.runtime.encryption import key_id
from gpufleet.runtime.files import read_json
from gpufleet.runtime.integrity import MARKER, survey
from gpufleet.runtime.sealed import OPENED
from tests.support.chaos import straight_run
from tests.support.cli import cli_env, gpufleet_cmd, run_cli, summary_of
from tests.support.procs import poll_until
from tests.support.s3 import S3, bucket_env, needs_versitygw
from tests.support.specs import digits_job, write_spec

pytestmark = [pytest.mark.slow, needs_versitygw]

JOB = "sealed"
KEY, OTHER = os.urandom(32), os.urandom(32)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """versitygw with bucket 'sealed', in this process's environment (s3fs reads it)."""
    with bucket_env(tmp_path_factory.mktemp("s3"), "sealed") as server:
        yield server


def key_file(directory: Path, key: bytes = KEY) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"key-{key_id(key)}"
    path.write_bytes(key)
    return str(path)


def state(step: int) -> dict[str, Any]:
    return {"m": {"w": torch.full((64, 64), float(step) + 0.25)}}


def loaded(ckpt: Checkpointer) -> tuple[int | None, str | None, float]:
    into = state(0)
    ref = ckpt.load_latest(into)
    return (ref.step if ref else None, ref.tier if ref else None, float(into["m"]["w"][0, 0]))


def sealed_tiers(tmp_path: Path, prefix: str, key: bytes | None = KEY) -> tuple[
        Checkpointer, Uploader]:  # fmt: skip
    """The loop's Checkpointer (its fast tier under tmp_path) and the node's uploader, sealing
    with ``key`` to s3://sealed/<prefix>."""
    durable = f"s3://sealed/{prefix}"
    read_with = key_file(tmp_path, key) if key else None
    ckpt = Checkpointer(str(tmp_path / "fast"), identity={"job": JOB}, durable=durable,
                        key_file=read_with)  # fmt: skip
    fast, store = tiers(str(tmp_path / "fast"), durable, JOB)
    return ckpt, Uploader(fast, store, keep=3, key=key)


def objects(s3: S3, prefix: str) -> dict[str, bytes]:
    fs = s3.fs()
    return {path: fs.cat_file(path) for path in fs.find(f"sealed/{prefix}")}


def test_the_store_holds_only_ciphertext_and_a_resume_decrypts_it_exactly(
    tmp_path: Path, s3: S3
) -> None:
    ckpt, up = sealed_tiers(tmp_path, "a")
    for step in (5, 10):
        ckpt.save(step, state(step))
        assert up.pass_once() is not None
    plain = {p.name: p.read_bytes() for p in Path(ckpt.complete()[-1].path).iterdir()}
    weights = state(10)["m"]["w"].numpy().tobytes()[:64]
    stored = objects(s3, "a")
    markers = {p: json.loads(b) for p, b in stored.items() if p.endswith(MARKER)}
    assert len(markers) == 2
    shards = [b for n, b in plain.items() if n.endswith(".distcp")]
    for path, data in stored.items():
        if not path.endswith(MARKER) and "/.parts/" not in path:
            assert weights not in data and not holds_any(data, shards), path
    marker = markers[max(markers)]
    assert marker["encryption"]["algorithm"] == "AES-256-GCM"
    assert marker["encryption"]["key_id"] == key_id(KEY)
    assert KEY.hex() not in json.dumps(marker) and marker["files"].keys() == {
        n for n in plain if n != MARKER}  # fmt: skip
    shutil.rmtree(tmp_path / "fast")  # the node is lost
    assert loaded(ckpt) == (10, "durable", 10.25)
    assert not any((tmp_path / "fast" / OPENED).iterdir())  # the plaintext copy is removed


def test_a_directory_durable_tier_is_sealed_too(tmp_path: Path) -> None:
    """A PVC's path as the durable tier: the same ciphertext, fsynced, and the same resume."""
    roots = str(tmp_path / "fast"), str(tmp_path / "pvc")
    ckpt = Checkpointer(roots[0], identity={"job": JOB}, durable=roots[1],
                        key_file=key_file(tmp_path))  # fmt: skip
    fast, pvc = tiers(*roots, JOB)
    ckpt.save(5, state(5))
    assert Uploader(fast, pvc, keep=1, key=KEY).pass_once() is not None
    weights = state(5)["m"]["w"].numpy().tobytes()[:64]
    assert not any(weights in p.read_bytes() for p in (tmp_path / "pvc").rglob("*") if p.is_file())
    shutil.rmtree(tmp_path / "fast")
    assert loaded(ckpt) == (5, "durable", 5.25)


def holds_any(data: bytes, plaintexts: list[bytes]) -> bool:
    """Whether ``data`` holds any 64-byte piece of ``plaintexts`` (one every 4 KiB)."""
    return any(p[i : i + 64] in data for p in plaintexts for i in range(0, len(p), 4096))


def test_a_job_with_a_key_refuses_a_plaintext_durable_copy(tmp_path: Path, s3: S3) -> None:
    """A newer plaintext checkpoint put on the durable tier (by anyone who may write the bucket,
    with the job's identity copied) is set aside; the sealed one before it is loaded."""
    ckpt, up = sealed_tiers(tmp_path / "job", "p")
    ckpt.save(5, state(5))
    assert up.pass_once() is not None
    planted, plain_up = sealed_tiers(tmp_path / "planted", "p", key=None)
    planted.save(10, state(10))
    assert plain_up.pass_once() is not None  # a plaintext step 10, its marker well formed
    lines: list[str] = []
    ckpt._log = lines.append
    shutil.rmtree(tmp_path / "job" / "fast")
    assert loaded(ckpt) == (5, "durable", 5.25)
    assert any("step 10 is corrupt" in ln and "a plaintext one" in ln for ln in lines), lines


def flip(s3: S3, directory: str, *, and_the_marker: bool) -> None:
    """Change one byte of the largest file of the sealed ``directory``; ``and_the_marker``:
    rewrite the marker's ciphertext digest to match, as an attacker with write access would."""
    fs = s3.fs()
    files = {p: fs.size(p) for p in fs.ls(directory) if not p.endswith((MARKER, ".parts"))}
    path = max(files, key=files.__getitem__)
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(path, bytes(data))
    if and_the_marker:
        import hashlib

        marker = json.loads(fs.cat_file(f"{directory}/{MARKER}"))
        name = path.rsplit("/", 1)[-1]
        marker["encryption"]["files"][name]["sha256"] = hashlib.sha256(data).hexdigest()
        fs.pipe_file(f"{directory}/{MARKER}", json.dumps(marker).encode())


@pytest.mark.parametrize("and_the_marker", [False, True], ids=["file", "file-and-marker"])
def test_a_tampered_copy_is_set_aside_and_the_resume_falls_back(
    tmp_path: Path, s3: S3, and_the_marker: bool
) -> None:
    """A changed ciphertext fails its digest; changed together with the marker's digest, the
    marker fails its HMAC: either way it is set aside, like a corrupt copy, and the older one
    is loaded."""
    prefix = f"t-{int(and_the_marker)}"
    ckpt, up = sealed_tiers(tmp_path, prefix)
    lines: list[str] = []
    ckpt._log = lines.append
    for step in (5, 10):
        ckpt.save(step, state(step))
        assert up.pass_once() is not None
    newest = max(p for p in s3.fs().ls(f"sealed/{prefix}"))
    flip(s3, newest, and_the_marker=and_the_marker)
    # `gpufleet checkpoints verify` checks the ciphertext without the key: it finds the first.
    found = [e.status for e in survey(s3.fs(), f"sealed/{prefix}")]
    assert found == ["OK", "OK" if and_the_marker else "CORRUPT"]
    shutil.rmtree(tmp_path / "fast")
    assert loaded(ckpt) == (5, "durable", 5.25)
    said = "one that does not verify" if and_the_marker else "expected sha256"  # its HMAC
    assert any("step 10 is corrupt" in ln and said in ln for ln in lines), lines
    assert s3.fs().exists(f"{newest}.corrupt")


@pytest.mark.parametrize("key", [None, OTHER], ids=["no-key", "another-key"])
def test_without_the_key_a_resume_is_one_error_naming_the_keys(
    tmp_path: Path, s3: S3, key: bytes | None
) -> None:
    writer, up = sealed_tiers(tmp_path / "w", f"k-{'x' if key else 'none'}")
    writer.save(5, state(5))
    assert up.pass_once() is not None
    reader, _ = sealed_tiers(tmp_path / "r", f"k-{'x' if key else 'none'}", key)
    with pytest.raises(CheckpointKeyError) as info:
        loaded(reader)
    assert f"encrypted with key {key_id(KEY)}" in str(info.value)
    assert (key_id(key) in str(info.value)) if key else "has no key" in str(info.value)
    assert not list(s3.fs().glob(f"sealed/k-{'x' if key else 'none'}/*.corrupt"))  # kept


# ---- a whole job ---------------------------------------------------------------------------
LONG = {"name": "digits", "steps": 200, "batchSize": 32, "logEvery": 1}
SECRET = {"keySecret": {"name": "ckpt-key", "key": "aes"}}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return straight_run(tmp_path_factory, "baseline", digits_job("straight", workload=LONG))


def test_a_job_preempted_and_its_node_lost_resumes_exactly_from_ciphertext(
    workdir: Path, s3: S3, baseline: dict[str, Any]
) -> None:
    """`gpufleet run` with the key in a local Secret (.gpufleet/secrets/ckpt-key/aes): the
    preemption checkpoint is sealed and uploaded, the fast tier is wiped, the rerun resumes
    from the durable copy and ends with the uninterrupted run's weights; no object holds a
    plaintext file's bytes."""
    secret = workdir / ".gpufleet" / "secrets" / "ckpt-key" / "aes"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(KEY)
    checkpoint = {"dir": "fast", "everySteps": 20, "keep": 2,
                  "durable": {"dir": "s3://sealed/job", "encryption": SECRET}}  # fmt: skip
    spec = write_spec(workdir, digits_job("sealed", workload=LONG, checkpoint=checkpoint))
    env = {**cli_env(), **s3.env}
    run_dir = workdir / ".gpufleet" / "runs" / "sealed"
    launcher = subprocess.Popen(gpufleet_cmd("run", str(spec), "-o", "json"), cwd=workdir,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    poll_until(lambda: (read_json(run_dir / "progress.json") or {}).get("step", 0) >= 30,
               what="step 30", alive=launcher, interval=0.05)  # fmt: skip
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == EXIT_PREEMPTED, err[-3000:]
    stopped = (read_json(run_dir / "preempted.json") or {})["step"]
    assert summary_of(subprocess.CompletedProcess([], 0, out, err))["durable"]["newest"] == stopped
    plaintext = [p.read_bytes() for p in (workdir / "fast").rglob("*.distcp")]
    assert plaintext
    assert not any(holds_any(data, plaintext) for data in objects(s3, "job").values())
    shutil.rmtree(workdir / "fast")
    again = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    s = summary_of(again)
    assert s["resumed_from"] == stopped and "durable tier" in again.stderr
    assert s["state_digest"] == baseline["state_digest"]
    secret.write_bytes(OTHER)  # not the key it was sealed with: the resume stops, naming both
    shutil.rmtree(workdir / "fast")
    wrong = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert wrong.returncode == EXIT_BAD_INPUT, wrong.stderr[-3000:]
    assert f"encrypted with key {key_id(KEY)}" in wrong.stderr and key_id(OTHER) in wrong.stderr
