"""Checkpointer on one process: new directory per step, markers, torn directories, keep-last-K."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from gpufleet.errors import CheckpointError, CheckpointMismatchError
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.context import CHECKPOINT_DEFAULTS, node_id
from gpufleet.runtime.integrity import MARKER


def model_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {"w": torch.randn(4, 4), "b": torch.randn(4)}


def test_save_and_load_latest(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), keep=5)
    ckpt.save(10, {"m": model_state(1)})
    ckpt.save(20, {"m": model_state(2)})
    into = {"m": model_state(99)}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 20
    assert torch.equal(into["m"]["w"], model_state(2)["w"])


def test_no_checkpoint_loads_nothing(tmp_path: Path) -> None:
    into = {"m": model_state(3)}
    assert Checkpointer(str(tmp_path / "empty")).load_latest(into) is None
    assert torch.equal(into["m"]["w"], model_state(3)["w"])


def test_torn_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), keep=5)
    ckpt.save(10, {"m": model_state(1)})
    torn = Path(ckpt.save(20, {"m": model_state(2)}))
    (torn / MARKER).unlink()  # as if the writer died before committing
    into = {"m": model_state(99)}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 10
    assert torch.equal(into["m"]["w"], model_state(1)["w"])


def test_every_save_gets_a_new_directory(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), keep=5)
    first = ckpt.save(10, {"m": model_state(1)})
    (Path(first) / MARKER).unlink()
    second = ckpt.save(10, {"m": model_state(2)})
    assert first != second
    assert Path(first).name.startswith("step_000000010-")
    assert not (Path(first) / MARKER).exists()


def test_keep_last_k_and_purge_torn(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), keep=2)
    torn = Path(ckpt.save(5, {"m": model_state(0)}))
    (torn / MARKER).unlink()
    for step in (10, 20, 30):
        ckpt.save(step, {"m": model_state(step)})
    assert [r.step for r in ckpt.complete()] == [20, 30]
    assert not torn.exists()


def test_async_save_commits_on_wait(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), keep=3, async_save=True)
    state = {"m": model_state(1)}
    path = Path(ckpt.save(10, state))
    ckpt.wait_staged()  # the fence the Trainer uses before optimizer.step()
    state["m"]["w"].add_(100)  # training goes on: the staged copy must not see this
    ckpt.wait()
    assert (path / MARKER).exists()
    into = {"m": model_state(99)}
    ckpt.load_latest(into)
    assert torch.equal(into["m"]["w"], model_state(1)["w"])


def test_async_staging_buffers_are_reused(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), keep=3, async_save=True)
    state = {"m": model_state(1)}
    ckpt.save(1, state)
    ckpt.wait()
    state["m"]["w"].add_(1)
    ckpt.save(2, state)
    ckpt.close()
    into = {"m": model_state(99)}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 2
    assert torch.equal(into["m"]["w"], model_state(1)["w"] + 1)  # the second copy is fresh


def test_checkpoint_files_are_dcp(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path))
    path = Path(ckpt.save(1, {"m": model_state(1)}))
    names = set(os.listdir(path))
    assert ".metadata" in names and MARKER in names
    assert any(n.endswith(".distcp") for n in names)


def test_fsspec_uri(tmp_path: Path) -> None:
    ckpt = Checkpointer(f"file://{tmp_path}/uri", keep=2)
    ckpt.save(7, {"m": model_state(7)})
    into = {"m": model_state(0)}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 7
    assert torch.equal(into["m"]["b"], model_state(7)["b"])


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("keep", [1, 3])
def test_marker_written_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int, async_save: bool
) -> None:
    """The writer is instrumented, not the clock: at the moment each marker becomes visible
    (its atomic rename), every data file of that checkpoint is already there, at its final size."""
    real_replace = os.replace
    at_commit: dict[str, dict[str, int]] = {}

    def recording_replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        if os.path.basename(dst) == MARKER:
            where = os.path.dirname(dst)
            at_commit[where] = {
                n: os.path.getsize(os.path.join(where, n)) for n in os.listdir(where) if n != MARKER
            }

    monkeypatch.setattr(os, "replace", recording_replace)
    ckpt = Checkpointer(str(tmp_path), keep=keep, async_save=async_save)
    paths = []
    for step in (3, 6):
        paths.append(ckpt.save(step, {"m": model_state(step)}))
        ckpt.wait()
    ckpt.close()
    survivors = paths[-keep:]
    assert sorted(at_commit) == sorted(paths), "one marker per save, written by rename"
    for path in survivors:
        final = {n: os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n != MARKER}
        assert ".metadata" in final and any(n.endswith(".distcp") for n in final), final
        assert at_commit[path] == final, "data written after the marker"


def flip_middle_of_largest_shard(directory: Path, count: int = 64) -> Path:
    """Bit-rot: invert ``count`` bytes in the middle of the directory's largest .distcp file."""
    shard = max(directory.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    shard.write_bytes(bytes(data))
    return shard


def checkpointer(root: Path, lines: list[str], keep: int = 5) -> Checkpointer:
    """A Checkpointer whose messages land in ``lines``."""
    return Checkpointer(str(root), log=lines.append, keep=keep)


@pytest.mark.parametrize("async_save", [False, True])
def test_marker_records_a_sha256_of_every_file(tmp_path: Path, async_save: bool) -> None:
    ckpt = Checkpointer(str(tmp_path), async_save=async_save)
    path = Path(ckpt.save(10, {"m": model_state(1)}))
    ckpt.wait()
    files = json.loads((path / MARKER).read_text())["files"]
    on_disk = sorted(p.name for p in path.iterdir() if p.name != MARKER)
    assert sorted(files) == on_disk and ".metadata" in files
    for name, entry in files.items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "host": node_id()}  # fmt: skip
    ckpt.close()


def test_a_corrupt_checkpoint_is_set_aside_and_the_previous_one_loads(tmp_path: Path) -> None:
    lines: list[str] = []
    ckpt = checkpointer(tmp_path, lines)
    ckpt.save(10, {"m": model_state(1)})
    newest = Path(ckpt.save(20, {"m": model_state(2)}))
    shard = flip_middle_of_largest_shard(newest)
    into = {"m": model_state(99)}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 10
    assert torch.equal(into["m"]["w"], model_state(1)["w"])
    aside = newest.with_name(newest.name + ".corrupt")
    assert aside.is_dir() and not newest.exists()  # renamed, never deleted
    (warning,) = [ln for ln in lines if "corrupt" in ln]
    expected = json.loads((aside / MARKER).read_text())["files"][shard.name]["sha256"]
    actual = hashlib.sha256((aside / shard.name).read_bytes()).hexdigest()
    assert shard.name in warning and expected in warning and actual in warning
    assert str(aside) in warning
    # Retention never touches it: it is not a checkpoint directory any more.
    for step in (30, 40, 50):
        ckpt.save(step, {"m": model_state(step)})
    assert aside.is_dir()


@pytest.mark.parametrize("damage", ["truncate", "delete-shard", "delete-metadata"])
def test_missing_or_truncated_files_are_caught(tmp_path: Path, damage: str) -> None:
    lines: list[str] = []
    ckpt = checkpointer(tmp_path, lines)
    ckpt.save(10, {"m": model_state(1)})
    newest = Path(ckpt.save(20, {"m": model_state(2)}))
    shard = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "delete-shard":
        shard.unlink()
    else:
        (newest / ".metadata").unlink()
    ref = ckpt.latest()
    assert ref is not None and ref.step == 10
    assert any("corrupt" in ln for ln in lines), lines


def test_no_usable_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    lines: list[str] = []
    ckpt = checkpointer(tmp_path, lines)
    only = Path(ckpt.save(10, {"m": model_state(1)}))
    flip_middle_of_largest_shard(only)
    with pytest.raises(CheckpointError, match=r"no usable checkpoint.*--fresh"):
        ckpt.latest()
    assert only.with_name(only.name + ".corrupt").is_dir()


def test_a_checkpoint_from_before_checksums_still_loads(tmp_path: Path) -> None:
    lines: list[str] = []
    ckpt = checkpointer(tmp_path, lines)
    path = Path(ckpt.save(10, {"m": model_state(1)}))
    marker = json.loads((path / MARKER).read_text())
    del marker["files"]
    (path / MARKER).write_text(json.dumps(marker))
    into = {"m": model_state(99)}
    ref = ckpt.load_latest(into)
    assert ref is not None and ref.step == 10
    assert torch.equal(into["m"]["w"], model_state(1)["w"])
    (notice,) = [ln for ln in lines if "predates checksums" in ln]
    assert "step 10" in notice


def test_cli_verify_lists_ok_corrupt_and_torn(tmp_path: Path) -> None:
    """`gpufleet checkpoints verify`: each checkpoint's status from reading every file; exit 1
    when the newest is unusable, 0 when it is OK."""
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), keep=5)
    paths = [Path(ckpt.save(step, {"m": model_state(step)})) for step in (10, 20, 30)]
    ok = CliRunner().invoke(app, ["checkpoints", "verify", str(tmp_path / "run"), "-o", "json"])
    assert ok.exit_code == 0, ok.output
    assert [c["status"] for c in json.loads(ok.stdout)["checkpoints"]] == ["OK"] * 3
    shard = flip_middle_of_largest_shard(paths[1])
    (paths[2] / MARKER).unlink()
    bad = CliRunner().invoke(app, ["checkpoints", "verify", str(tmp_path / "run" / "checkpoints")])
    assert bad.exit_code == 1, bad.output
    rows = {ln.split()[0]: ln.split()[1] for ln in bad.stdout.splitlines()[1:4]}
    assert rows == {"10": "OK", "20": "CORRUPT", "30": "TORN"}, bad.stdout
    assert f"step 20: {shard.name}: expected sha256" in bad.stdout
    assert (paths[1]).is_dir()  # verify only reads: nothing set aside
    missing = CliRunner().invoke(app, ["checkpoints", "verify", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such directory" in missing.output


def identity(job: str, model: str = "m1") -> dict[str, str]:
    return {"job": job, "workload": "digits", "model": model}


def test_another_jobs_or_models_checkpoint_is_refused_and_never_deleted(tmp_path: Path) -> None:
    """Two jobs on one checkpoint directory: the second neither resumes from the first's
    checkpoints (exit 2 naming both) nor rotates them out; another model is refused too."""
    a = Checkpointer(str(tmp_path), keep=1, identity=identity("job-a"))
    a_dirs = [Path(a.save(step, {"m": model_state(step)})) for step in (10, 20)]
    assert not a_dirs[0].exists() and a_dirs[1].exists()  # a's own rotation works
    b = Checkpointer(str(tmp_path), keep=1, identity=identity("job-b"))
    with pytest.raises(CheckpointMismatchError, match="belongs to job job-a, not job-b"):
        b.latest()
    b.save(30, {"m": model_state(30)})
    b.save(40, {"m": model_state(40)})
    assert a_dirs[1].exists()  # b's rotation kept a's checkpoint
    other_model = Checkpointer(str(tmp_path), identity=identity("job-b", model="m2"))
    with pytest.raises(CheckpointMismatchError, match=r"another model .*fingerprint m1.*m2"):
        other_model.latest()
    assert CheckpointMismatchError.exit_code == 2 and CheckpointMismatchError.fatal


def test_the_checkpointer_owns_the_save_cadence(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path), every_steps=5)
    assert [step for step in range(1, 13) if ckpt.should_save(step)] == [5, 10]
    assert ckpt.should_save(7, final=True)  # the last step is always saved
    assert ckpt.should_save(3, preempted=True)  # so is the step all ranks stopped at
    assert not ckpt.should_save(4)
    default = Checkpointer(str(tmp_path / "default"))
    assert default.every_steps == CHECKPOINT_DEFAULTS.every_steps
