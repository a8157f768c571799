"""Faults, injected and survived: GPUFLEET_FAULTS's points, ranks and restarts (in a real process:
test_fault_processes.py), and the storage refusing a checkpoint save (ENOSPC, a failed rename, a
name collision), each with its documented outcome: the one clear error, the torn directory gone,
the earlier checkpoint still loadable."""

from __future__ import annotations

import errno
import importlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from gpufleet import torchapi
from gpufleet.errors import CheckpointError, CheckpointStorageError, NoUsableCheckpointError
from gpufleet.runtime import choose, faults
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.checkpoint_io import storage_error, storage_failure
from gpufleet.runtime.files import read_json, write_atomic_fs, write_bytes_atomic
from gpufleet.runtime.integrity import MARKER
from gpufleet.runtime.tier import Tier


@pytest.fixture
def fault_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """GPUFLEET_FAULTS is read once per process: the cache is cleared around each test."""
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("RANK", "1")
    faults._active.cache_clear()
    yield monkeypatch
    faults._active.cache_clear()


def state(value: float) -> dict[str, Any]:
    return {"m": {"w": torch.full((8, 8), value), "b": torch.full((8,), value)}}


def loaded(ckpt: Checkpointer) -> tuple[int | None, float]:
    into = state(0.0)
    ref = ckpt.load_latest(into)
    return (ref.step if ref else None, float(into["m"]["w"][0, 0]))


# ---- GPUFLEET_FAULTS ---------------------------------------------------------------------
def test_a_fault_is_active_only_at_its_point_rank_and_restart(
    fault_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fault_env.setenv(faults.ENV_FAULTS, "slow@calibrate=2,rank=1;nan@batch=3,rank=1,restart=1")
    assert faults.active("slow", "calibrate", 2)
    assert capsys.readouterr().err == "gpufleet-fault: slow at calibrate=2 on rank 1\n"
    assert not faults.active("slow", "calibrate", 3)  # another count
    assert not faults.active("kill", "calibrate", 2)  # another action
    assert not faults.nan_fires("batch", 3)  # restart 1's, and this is the first attempt
    fault_env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert faults.nan_fires("batch", 3) and not faults.nan_fires("batch", 4)
    fault_env.setenv("RANK", "0")
    assert not faults.nan_fires("batch", 3)  # rank 1's
    assert capsys.readouterr().err == "gpufleet-fault: nan at batch=3 on rank 1\n"


def test_a_nan_fault_without_poison_does_nothing_and_the_next_fault_still_fires(
    fault_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fault_env.setenv(faults.ENV_FAULTS, "nan@step=25,rank=1;device@step=25,rank=1")
    with pytest.raises(torch.AcceleratorError) as caught:
        faults.maybe_fire("step", 25)
    assert caught.value.error_code == faults.LOST_DEVICE_CODE  # type: ignore[attr-defined]
    assert capsys.readouterr().err.splitlines() == [
        "gpufleet-fault: nan at step=25 on rank 1",
        "gpufleet-fault: device at step=25 on rank 1",
    ]
    faults.maybe_fire("step", 24)  # no fault there: returns
    assert capsys.readouterr().err == ""


# ---- the storage refusing a checkpoint ----------------------------------------------------
def failing_fsync(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_disk_is_one_clear_error_and_the_earlier_checkpoint_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_save: bool
) -> None:
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=async_save)
    ckpt.save(1, state(1.0))
    ckpt.wait()
    failing_fsync(monkeypatch, errno.ENOSPC)
    with pytest.raises(CheckpointStorageError) as caught:
        ckpt.save(2, state(2.0))
        ckpt.wait()
    message = str(caught.value)
    assert message.startswith(f"the checkpoint of step 2 could not be written to {ckpt.root}: "
                              "[Errno 28] No space left on device; ")  # fmt: skip
    assert " MiB free of " in message and "stay loadable (newest: step 1)" in message
    monkeypatch.undo()
    assert [s for s, _, _ in ckpt.list_dirs()] == [1]  # the torn directory was removed
    assert loaded(ckpt) == (1, 1.0)
    ckpt.close()


def test_a_storage_error_with_no_listing_says_none_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = Checkpointer(str(tmp_path / "ckpt"))

    def unlistable() -> list[Any]:
        raise OSError(errno.EIO, "Input/output error")

    failing_fsync(monkeypatch, errno.EROFS)
    monkeypatch.setattr(ckpt.fast, "list_dirs", unlistable)
    with pytest.raises(CheckpointStorageError, match=r"Read-only file system; .*\(none yet\)"):
        ckpt.save(1, state(1.0))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_an_error_that_is_not_the_storages_is_raised_as_it_is_and_the_save_stays_torn(
    tmp_path: Path, fault_env: pytest.MonkeyPatch, async_save: bool
) -> None:
    """A device lost between writing a checkpoint's data and its marker: the error itself
    reaches the caller (the restart handles it), nothing is committed, step 1 still loads."""
    fault_env.setenv("RANK", "0")
    fault_env.setenv(faults.ENV_FAULTS, "device@checkpoint_written=2")
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=async_save)
    ckpt.save(1, state(1.0))
    with pytest.raises(torch.AcceleratorError, match="unspecified launch failure"):
        ckpt.save(2, state(2.0))
        ckpt.wait()  # an async save's error surfaces here
    assert [(s, ok) for s, _, ok in ckpt.list_dirs()] == [(1, True), (2, False)]
    assert loaded(ckpt) == (1, 1.0)
    ckpt.close()


def test_a_directory_name_is_drawn_again_until_unused_and_refused_after_eight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "step_000000005-aaaaaa").mkdir()  # e.g. a torn earlier attempt's
    draws, real = iter(["aaaaaa", "bbbbbb"]), secrets.token_hex

    def suffix(value: Any) -> Any:  # 3 bytes: a directory's (the marker's temp file draws 4)
        return lambda n: (value() if callable(value) else value) if n == 3 else real(n)

    monkeypatch.setattr(secrets, "token_hex", suffix(lambda: next(draws)))
    assert Path(ckpt.save(5, state(5.0))).name == "step_000000005-bbbbbb"
    monkeypatch.setattr(secrets, "token_hex", suffix("bbbbbb"))  # always taken
    with pytest.raises(CheckpointError, match="no unused checkpoint directory name for step 5 in "):
        ckpt.save(5, state(5.0))
    assert loaded(ckpt) == (5, 5.0)  # the committed one is untouched


def test_a_stager_that_stages_in_place_still_commits_the_async_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP returns the upload future alone when staging is synchronous."""
    staging = importlib.import_module("torch.distributed.checkpoint.staging")
    if not hasattr(staging, "DefaultStager"):
        pytest.skip("torch < 2.9 has no DefaultStager (the next test is that torch's path)")
    sync = staging.StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                  use_async_staging=False, use_non_blocking_copy=False)  # fmt: skip
    monkeypatch.setattr(torchapi, "new_stager", lambda **_: staging.DefaultStager(sync))
    async_save_commits(tmp_path)


def test_an_async_save_without_a_stager_commits_as_torch_before_2_9_does_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before torch 2.9, async_save copies the state before it returns: no staging future."""
    monkeypatch.setattr(torchapi, "new_stager", lambda **_: None)
    async_save_commits(tmp_path)


def async_save_commits(tmp_path: Path) -> None:
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=True)
    ckpt.save(3, state(3.0))
    assert ckpt._staging is None  # nothing to wait for: the state was copied
    ckpt.wait_staged()
    ckpt.close()
    assert [(s, ok) for s, _, ok in ckpt.list_dirs()] == [(3, True)]
    assert loaded(ckpt) == (3, 3.0)


def test_a_checkpoint_on_an_object_store_saves_and_loads_through_fsspec() -> None:
    root = "memory://ckpt-unit-objstore"
    ckpt = Checkpointer(root)
    try:
        path = ckpt.save(4, state(4.0))
        assert path.startswith("memory://") and ckpt.fast.fs.exists(f"{path}/{MARKER}")
        assert loaded(ckpt) == (4, 4.0)
    finally:
        ckpt.fast.fs.rm(ckpt.fast.root_path, recursive=True)


# ---- what counts as the storage's error, and what is said --------------------------------
def test_the_storage_error_is_found_through_causes_contexts_and_dcps_failures() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert storage_error(CheckpointException("save", {1: (full, None)})) is full  # type: ignore[dict-item]
    bare = CheckpointException("save", {0: full})  # type: ignore[dict-item]  # no traceback
    assert storage_error(bare) is full
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = PermissionError(errno.EACCES, "Permission denied")
    assert storage_error(wrapped) is wrapped.__cause__
    transient, loop = OSError(errno.ECONNRESET, "reset"), ValueError("x")
    transient.__context__, loop.__context__ = loop, transient  # a cycle: no endless walk
    assert storage_error(transient) is None


def test_the_storage_failure_of_an_object_store_names_no_free_space() -> None:
    said = storage_failure(7, "s3://b/p", OSError(errno.EDQUOT, "quota"), [], local=False)
    reason = f"[Errno {errno.EDQUOT}] {os.strerror(errno.EDQUOT)}"
    assert said.startswith(f"the checkpoint of step 7 could not be written to s3://b/p: {reason}; ")
    assert "(none yet)" in said and "MiB" not in said


# ---- files -----------------------------------------------------------------------------
def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    write_bytes_atomic(target, b'{"step": 1}')

    def no_rename(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="No space left"):
        write_bytes_atomic(target, b'{"step": 2}')
    assert read_json(target) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_read_json_is_none_for_a_missing_or_truncated_file(tmp_path: Path) -> None:
    assert read_json(tmp_path / "nope.json") is None
    (tmp_path / "cut.json").write_text('{"step": ')
    assert read_json(tmp_path / "cut.json") is None


def test_an_object_store_write_is_one_put() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    write_atomic_fs(fs, "/atomic-unit/x.json", b"{}", local=False)
    try:
        assert fs.cat_file("/atomic-unit/x.json") == b"{}"
        assert fs.ls("/atomic-unit", detail=False) == ["/atomic-unit/x.json"]
    finally:
        fs.rm("/atomic-unit", recursive=True)


# ---- which copy a resume loads, and tier housekeeping ---------------------------------------
def committed(root: Path, step: int, data: bytes = b"weights") -> Path:
    """A complete checkpoint directory with one file and its marker (sizes and checksums)."""
    import hashlib
    import json

    path = root / f"step_{step:09d}-{step:06x}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(data)
    files = {"__0_0.distcp": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    (path / MARKER).write_text(json.dumps({"step": step, "world_size": 2, "files": files}))
    return path


def test_split_fast_checkpoints_resume_from_the_durable_tier_or_say_why_not(
    tmp_path: Path,
) -> None:
    fast, durable = Tier(str(tmp_path / "fast")), Tier(str(tmp_path / "pvc"), name="durable")
    split = committed(tmp_path / "fast", 10).name
    committed(tmp_path / "pvc", 10)
    lines: list[str] = []
    ref = choose.newest_usable(fast, durable, {}, lines.append, frozenset({split}))
    assert ref is not None and (ref.step, ref.tier, ref.world_size) == (10, "durable", 2)
    assert lines == ["gpufleet: the fast tier's checkpoints of step 10 are split over the "
                     "nodes' own disks: resuming from the durable tier"]  # fmt: skip
    assert (tmp_path / "fast" / split).is_dir()  # skipped, not set aside: nothing is wrong
    with pytest.raises(NoUsableCheckpointError, match=r"the fast tier's \(step 10\) are split"):
        choose.newest_usable(fast, None, {}, lines.append, frozenset({split}))


def test_an_unreachable_durable_tier_is_a_warning_with_a_fast_copy_and_an_error_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = Tier(str(tmp_path / "fast"))
    durable = Tier("memory://unreachable-unit/ckpt", name="durable")

    def unreachable(path: str, detail: bool = True, **kw: Any) -> list[Any]:
        raise ConnectionError("could not connect to the endpoint")

    monkeypatch.setattr(durable.fs, "ls", unreachable)
    with pytest.raises(CheckpointError) as caught:
        choose.newest_usable(fast, durable, {}, print)  # step 0 could lose the durable ones
    said = f"the durable tier {durable.root} is unreachable (could not connect to the endpoint)"
    assert str(caught.value).startswith(f"{said} and the fast tier {fast.root} holds no checkpoint")
    committed(tmp_path / "fast", 5)
    lines: list[str] = []
    ref = choose.newest_usable(fast, durable, {}, lines.append)
    assert ref is not None and (ref.step, ref.tier) == (5, "fast")
    assert lines == [f"gpufleet: WARNING the durable tier {durable.root} is unreachable (could "
                     "not connect to the endpoint); resuming from the fast tier alone"]  # fmt: skip


def test_each_node_names_the_checkpoints_it_cannot_read_whole(tmp_path: Path) -> None:
    fast = Tier(str(tmp_path / "fast"))
    whole, short, gone = (committed(tmp_path / "fast", s) for s in (5, 10, 15))
    unreadable = committed(tmp_path / "fast", 20)
    (unreadable / MARKER).write_text("{cut")  # rank 0's own check reports it
    (committed(tmp_path / "fast", 25) / MARKER).write_text("{}")  # before checksums: no sizes
    wanted = choose.wanted(fast)
    assert wanted == {p.name: {"__0_0.distcp": 7} for p in (whole, short, gone)}
    (short / "__0_0.distcp").write_bytes(b"short")  # another node's copy, cut
    import shutil

    shutil.rmtree(gone)  # this node never had it
    assert choose.lacking(fast, wanted) == {short.name, gone.name}


def test_an_unreadable_marker_is_one_mismatch_and_a_failed_delete_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    tier = Tier(str(tmp_path / "t"), log=lines.append)
    assert tier.list_dirs() == []  # no directory yet: nothing, not an error
    old, new = committed(tmp_path / "t", 1), committed(tmp_path / "t", 2)
    (new / MARKER).write_text("not json")
    marker, problems = tier.check(tier.complete()[-1])
    assert marker == {} and problems is not None and [p.file for p in problems] == [MARKER]

    def busy(path: str, recursive: bool = False) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(tier.fs, "rm", busy)
    tier.purge(2, keep=1)
    assert old.is_dir()  # kept, and retried at the next purge
    assert lines == [f"gpufleet: could not delete old checkpoint {old}: [Errno 16] Device or "
                     "resource busy"]  # fmt: skip
    tier.remove(str(old))  # quiet
    assert old.is_dir()
