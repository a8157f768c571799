"""The durable tier's uploader (gpufleet.runtime.durable) on real tiers: local directories and
fsspec's in-memory object store (no rename, no fsync: what an object store offers). Faults of the
store are injected at the filesystem call that would fail; each test names what the uploader
must then do (retry, report, never write the marker of an unverified copy)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from gpufleet.runtime import durable
from gpufleet.runtime.durable import PARTS, UploadState
from gpufleet.runtime.integrity import MARKER
from tests.support.checkpoints import FILES, commit, durable_steps, unchecked, uploader


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real waiting between tries and passes (the delays are not the subject)."""
    monkeypatch.setattr(durable, "BACKOFF", (0.0, 0.0))
    monkeypatch.setattr(durable, "POLL", 0.01)


@pytest.fixture
def mem() -> Iterator[str]:
    """A fresh root on fsspec's in-memory object store, removed afterwards."""
    root = f"memory://t{uuid.uuid4().hex[:12]}"
    yield root
    fs = fsspec.filesystem("memory")  # its store directly: a test may have broken its methods
    base = fs._strip_protocol(root)
    for key in [k for k in fs.store if k.startswith(base)]:
        del fs.store[key]
    fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not d.startswith(base)]


def test_the_state_before_any_commit_has_no_lag_and_its_json_carries_the_lags() -> None:
    assert UploadState().lag_steps() == 0 and UploadState().lag_seconds() == 0.0
    behind = UploadState(newest_fast=30, pending_since=100.0)
    assert behind.lag_steps() == 30  # nothing durable yet: all 30 steps behind
    assert behind.lag_seconds(now=160.0) == 60.0
    assert UploadState(newest_fast=30, newest_durable=20).to_json()["lag_steps"] == 10


def test_a_local_upload_is_byte_for_byte_with_its_part_record_and_the_marker(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"),
                  on_change=lambda s: seen.append(s.to_json()))  # fmt: skip
    name = commit(str(tmp_path / "fast"), 10)
    ref = up.pass_once()
    assert ref is not None and ref.step == 10
    dst = tmp_path / "pvc" / name
    for file, data in FILES.items():
        assert (dst / file).read_bytes() == data
    assert json.loads((dst / PARTS / "n0.json").read_text()) == sorted(FILES)
    assert (dst / MARKER).read_bytes() == (tmp_path / "fast" / name / MARKER).read_bytes()
    assert seen[-1]["newest_durable"] == 10 and seen[-1]["lag_steps"] == 0
    assert up.state.uploaded == [10] and up.state.pending_since is None


def test_an_object_store_to_object_store_copy_streams_every_file(mem: str) -> None:
    up = uploader(f"{mem}/fast", f"{mem}/bucket")
    name = commit(f"{mem}/fast", 5)
    assert up.pass_once() is not None
    fs = fsspec.filesystem("memory")
    base = fs._strip_protocol(f"{mem}/bucket")
    assert {f: fs.cat_file(f"{base}/{name}/{f}") for f in FILES} == FILES
    assert durable_steps(up) == [5]


def test_a_corrupted_upload_is_uploaded_again_and_then_verifies(
    tmp_path: Path, mem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps a damaged copy of the first PUT (a bad proxy, a flipped bit): the read
    back finds it, the fast copy still matches its marker, so the file is uploaded again."""
    up = uploader(str(tmp_path / "fast"), f"{mem}/bucket")
    name = commit(str(tmp_path / "fast"), 10)
    real_put, puts = up.durable.fs.put_file, []

    def damaging_put(src: str, dst: str, **kw: Any) -> None:
        puts.append(dst)
        real_put(src, dst, **kw)
        if len(puts) == 1:
            up.durable.fs.pipe_file(dst, b"damaged")

    monkeypatch.setattr(up.durable.fs, "put_file", damaging_put)
    assert up.pass_once() is not None
    assert len(puts) == len(FILES) + 1  # the damaged file twice
    assert puts[0] == puts[1] and up.state.error is None and up.state.failures == 0
    file = puts[0].rsplit("/", 1)[-1]
    base = up.durable.fs._strip_protocol(f"{mem}/bucket")
    assert up.durable.fs.cat_file(f"{base}/{name}/{file}") == FILES[file]


def test_a_transient_store_error_is_retried_within_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 10)
    real_fsync, calls = os.fsync, []

    def failing_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    assert up.pass_once() is not None
    assert up.state.uploaded == [10] and up.state.failures == 0 and up.state.error is None


def test_a_file_the_store_never_shows_fails_the_pass_after_every_attempt_and_no_marker(
    tmp_path: Path, mem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store accepts the PUT but never lists the object (read-after-write not kept): every
    attempt fails, the pass reports the last reason, and the checkpoint is not called durable."""
    lines: list[str] = []
    up = uploader(str(tmp_path / "fast"), f"{mem}/bucket", log=lines.append)
    name = commit(str(tmp_path / "fast"), 10)

    def size(path: str) -> int:
        raise FileNotFoundError(errno.ENOENT, "NoSuchKey", path)

    monkeypatch.setattr(up.durable.fs, "size", size)
    assert up.pass_once() is None
    assert up.state.error is not None
    assert f"{durable.ATTEMPTS} attempts failed, the last: .metadata: " in up.state.error
    assert up.state.failures == 1 and "NoSuchKey" in up.state.error
    assert not up.durable.fs.exists(f"{up.durable.root_path}/{name}/{MARKER}")
    assert lines and "WARNING durable tier: step 10 to" in lines[-1]
    assert "training goes on, retrying" in lines[-1]


def test_a_fast_file_gone_mid_upload_says_so(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    name = commit(str(tmp_path / "fast"), 10)
    (tmp_path / "fast" / name / "__0_0.distcp").unlink()
    assert up.pass_once() is None
    assert up.state.error and up.state.error.endswith("__0_0.distcp is not on the fast tier")


def test_a_fast_copy_that_no_longer_matches_its_marker_is_refused(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    name = commit(str(tmp_path / "fast"), 10)
    (tmp_path / "fast" / name / "__0_0.distcp").write_bytes(b"\x09\x02" * 500)  # same size
    assert up.pass_once() is None
    assert up.state.error and "the fast copy of __0_0.distcp does not match" in up.state.error
    assert not (tmp_path / "pvc" / name / MARKER).exists() and durable_steps(up) == []


def test_a_failed_checkpoint_waits_retry_after_then_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 10)
    calls: list[int] = []

    def full(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", full)
    assert up.pass_once() is None and len(calls) == durable.ATTEMPTS
    assert up.state.error and "No space left on device" in up.state.error
    assert up.pass_once() is None and len(calls) == durable.ATTEMPTS  # not tried again yet
    monkeypatch.setattr(os, "fsync", real_fsync)
    monkeypatch.setattr(durable, "RETRY_AFTER", 0.0)
    assert up.pass_once() is not None
    assert up.state.error is None and up.state.failures == 1 and up.state.uploaded == [10]


def test_a_marker_without_checksums_is_never_made_durable(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    unchecked(tmp_path / "fast", 10)
    assert up.pass_once() is None
    assert up.state.error and "its marker has no checksums" in up.state.error
    assert up.stop().never_durable == [10]


def test_a_stop_during_an_upload_ends_it_without_a_marker(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 10)
    up.stop()
    assert up.pass_once() is None
    assert up.state.error and "stopped while uploading .metadata" in up.state.error
    assert durable_steps(up) == [] and up.stop().never_durable == [10]


def test_a_commit_the_loop_has_not_seen_yet_is_named_at_the_stop(tmp_path: Path) -> None:
    logs: list[str] = []
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"), log=logs.append)
    commit(str(tmp_path / "fast"), 10)
    assert up.pass_once() is not None
    commit(str(tmp_path / "fast"), 20)  # the preemption's, while the loop retried (no pass)
    final = up.stop()
    assert final.newest_fast == 20 and final.never_durable == [20] and final.lag_steps() == 10
    up.fast.complete = lambda: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
    assert up.stop().never_durable == [20] and "could not list the fast tier" in logs[-1]


def test_the_loop_survives_a_failing_pass_and_uploads_on_the_next(tmp_path: Path) -> None:
    """A bug in a pass (here the fast tier's listing raising once) is reported and the loop
    goes on: training must never lose its uploads to one bad pass."""
    lines: list[str] = []
    errors: list[str | None] = []
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"), log=lines.append,
                  on_change=lambda s: errors.append(s.error))  # fmt: skip
    commit(str(tmp_path / "fast"), 10)
    real_complete, calls = up.fast.complete, []

    def flaky_complete() -> list[Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("listing broke")
        return real_complete()

    up.fast.complete = flaky_complete  # type: ignore[method-assign]
    up.start()
    try:
        assert up.drain(10.0)
    finally:
        final = up.stop()
    assert "uploader pass failed: RuntimeError('listing broke')" in errors
    assert any("uploader pass failed" in ln for ln in lines)
    assert final.failures == 1 and final.uploaded == [10] and final.error is None


def test_drain_without_a_thread_uploads_in_place(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    assert up.drain(5.0)  # nothing committed: nothing to wait for
    commit(str(tmp_path / "fast"), 10)
    assert up.drain(5.0) and durable_steps(up) == [10]


def test_drain_gives_up_at_its_timeout_when_the_upload_keeps_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 10)

    def readonly(fd: int) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "fsync", readonly)
    assert not up.drain(0.2)
    assert up.state.error and "Read-only file system" in up.state.error
    assert up.state.newest_durable is None and up.state.lag_steps() == 10


def test_a_newer_commit_supersedes_an_older_one_not_yet_durable(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"), keep=1)
    commit(str(tmp_path / "fast"), 5)
    commit(str(tmp_path / "fast"), 10)
    assert up.pass_once() is not None
    assert durable_steps(up) == [10] and up.state.never_durable == [5]
    commit(str(tmp_path / "fast"), 15)
    assert up.pass_once() is not None
    assert durable_steps(up) == [15]  # durable retention: keep 1, after the verified upload


def test_the_lag_stays_while_the_newest_commit_seen_is_not_durable(tmp_path: Path) -> None:
    """Step 10 cannot be uploaded and then leaves the fast tier: the uploader makes 5 durable,
    but 10 was committed and never made durable, so the lag still counts it."""
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 5)
    bad = commit(str(tmp_path / "fast"), 10)
    (tmp_path / "fast" / bad / "__0_0.distcp").unlink()
    assert up.pass_once() is None
    (tmp_path / "fast" / bad / MARKER).unlink()  # torn now: no longer listed
    assert up.pass_once() is not None
    assert up.state.newest_durable == 5 and up.state.newest_fast == 10
    assert up.state.lag_steps() == 5 and up.state.pending_since is not None


def test_an_already_durable_checkpoint_is_not_uploaded_again(tmp_path: Path) -> None:
    first = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 10)
    assert first.pass_once() is not None
    changes: list[int | None] = []
    again = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"),  # the launcher restarted
                     on_change=lambda s: changes.append(s.newest_durable))  # fmt: skip
    ref = again.pass_once()
    assert ref is not None and ref.step == 10
    assert again.state.newest_durable == 10 and again.state.uploaded == []
    assert again.pass_once() == ref and changes == [None, 10]  # no news: no second report


def test_the_pending_time_is_the_oldest_commit_not_yet_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    unchecked(tmp_path / "fast", 5)  # neither can be uploaded
    assert up.pass_once() is None
    since = up.state.pending_since
    monkeypatch.setattr(time, "time", lambda: (since or 0) + 100.0)
    unchecked(tmp_path / "fast", 10)
    assert up.pass_once() is None
    assert up.state.newest_fast == 10 and up.state.pending_since == since
    assert up.state.lag_seconds(now=(since or 0) + 100.0) == 100.0


def test_a_fast_copy_removed_before_its_upload_is_reported(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    name = commit(str(tmp_path / "fast"), 10)
    (ref,) = up.fast.complete()
    (tmp_path / "fast" / name / MARKER).unlink()  # retention won the race
    gone = r"its fast copy was removed \(retention\) before upload"
    with pytest.raises(durable.UploadError, match=gone):
        up.upload(ref)


def test_a_store_that_cannot_say_what_is_durable_gets_no_marker(
    tmp_path: Path, mem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = uploader(str(tmp_path / "fast"), f"{mem}/bucket")
    commit(str(tmp_path / "fast"), 10)

    def unreachable(path: str) -> bool:
        raise ConnectionError("endpoint unreachable")

    monkeypatch.setattr(up.durable.fs, "exists", unreachable)
    monkeypatch.setattr(up.durable, "complete", list)  # the first pass's listing: empty
    assert up.pass_once() is None
    assert up.state.error and up.state.error.endswith("endpoint unreachable")
    assert up.state.newest_durable is None


def test_another_jobs_checkpoint_is_never_uploaded(tmp_path: Path) -> None:
    up = uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"))
    commit(str(tmp_path / "fast"), 10, identity={"job": "someone-else"})
    assert up.pass_once() is None
    assert not (tmp_path / "pvc").exists() or durable_steps(up) == []
    assert up.state.newest_fast is None


def test_the_marker_waits_for_every_nodes_part(tmp_path: Path) -> None:
    """Node a wrote the marker, node b's ranks one file: b uploads its file and part only; a
    waits for b's part, then writes the marker. Node names become safe file names."""
    fast = str(tmp_path / "fast")
    name = commit(fast, 10, host="pod/a:0", hosts={"__0_0.distcp": "pod/b:1"})
    a = uploader(fast, str(tmp_path / "pvc"), node="pod/a:0")
    b = uploader(fast, str(tmp_path / "pvc"), node="pod/b:1")
    assert a.pass_once() is None
    assert a.state.waiting == "step 10 waits for the files of node pod/b:1"
    assert a.state.error is None and durable_steps(a) == []
    assert b.pass_once() is None and durable_steps(b) == []  # the marker is a's to write
    parts = tmp_path / "pvc" / name / PARTS
    assert json.loads((parts / "pod_b_1.json").read_text()) == ["__0_0.distcp"]
    assert json.loads((parts / "pod_a_0.json").read_text()) == [".metadata"]
    assert a.pass_once() is not None
    assert durable_steps(a) == [10] and a.state.waiting is None


def test_what_it_remembers_per_checkpoint_ends_with_the_fast_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its memos per checkpoint directory (owner, last failure, part uploaded) keep only what
    the fast tier still lists: over a job's life of checkpoints, retention bounds them."""
    fast, up = tmp_path / "fast", uploader(str(tmp_path / "fast"), str(tmp_path / "pvc"), keep=2)
    commit(str(fast), 5, identity={"job": "someone-else"})
    monkeypatch.setattr(durable, "RETRY_AFTER", 60.0)
    for step in range(10, 310, 10):
        name = commit(str(fast), step)
        if step == 10:  # one failed pass: remembered until its directory goes
            with monkeypatch.context() as m:
                m.setattr(os, "fsync", lambda _fd: throw(OSError(errno.ENOSPC, "full")))
                assert up.pass_once() is None and name in up._failed_at
            shutil.rmtree(fast / name)
            continue
        assert up.pass_once() is not None
        for old in sorted(p for p in fast.iterdir() if p.name != name)[1:-1]:
            shutil.rmtree(old)  # the fast tier's retention: the other job's and the newest two
    listed = {p.name for p in fast.iterdir()}
    assert up.pass_once() is not None  # the next pass forgets what retention removed
    assert durable_steps(up) == [290, 300] and len(listed) == 3
    assert set(up._owned) == listed and up._parts <= listed and not up._failed_at


def throw(exc: Exception) -> None:
    raise exc
