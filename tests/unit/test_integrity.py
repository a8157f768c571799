"""Checkpoint integrity on real filesystems (a local directory, fsspec's in-memory object store):
``verify`` names every bad file, ``survey`` reports each step directory as ``gpufleet
checkpoints verify`` prints it, ``set_aside`` moves a corrupt checkpoint out of the way without
losing a byte, and ``check_identity`` refuses another job's or model's checkpoint with a message
that says what to do."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from gpufleet.errors import CheckpointMismatchError
from gpufleet.runtime.integrity import (
    MARKER,
    Entry,
    Mismatch,
    base_name,
    check_identity,
    file_digests,
    join,
    owner,
    set_aside,
    survey,
    verify,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recorded(files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    """The ``files`` a marker records for these contents."""
    return {name: {"size": len(data), "sha256": sha(data)} for name, data in files.items()}


@pytest.fixture
def memfs() -> Iterator[tuple[Any, str]]:
    """fsspec's in-memory object store and a root of this test's own: its store is
    process-global, so the root is unique and removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/gpufleet-test-{uuid.uuid4().hex}"
    try:
        yield fs, root
    finally:
        if fs.exists(root):
            fs.rm(root, recursive=True)


def test_verify_names_every_missing_truncated_and_altered_file(tmp_path: Path) -> None:
    """Checking goes on past each bad file: all three are reported, in the marker's order."""
    originals = {
        "__0_0.distcp": b"shard zero",
        "__1_0.distcp": b"shard one, longer",
        "__2_0.distcp": b"shard two",
        ".metadata": b"metadata",
    }
    (tmp_path / "__1_0.distcp").write_bytes(b"shard one")  # cut short by a bad copy
    (tmp_path / "__2_0.distcp").write_bytes(b"shard twO")  # same size, one byte flipped
    (tmp_path / ".metadata").write_bytes(originals[".metadata"])
    marker = {"files": recorded(originals)}

    problems = verify(fsspec.filesystem("file"), str(tmp_path), marker)

    assert problems == [
        Mismatch("__0_0.distcp", f"sha256 {sha(b'shard zero')[:16]}", "no such file"),
        Mismatch("__1_0.distcp", "17 bytes", "9 bytes"),
        Mismatch("__2_0.distcp", f"sha256 {sha(b'shard two')}", f"sha256 {sha(b'shard twO')}"),
    ]
    assert str(problems[0]) == (
        f"__0_0.distcp: expected sha256 {sha(b'shard zero')[:16]}, got no such file"
    )
    assert str(problems[1]) == "__1_0.distcp: expected 17 bytes, got 9 bytes"


def put_step(fs: Any, root: str, name: str, files: dict[str, bytes]) -> tuple[str, int]:
    """A step directory holding ``files``; its path and the bytes it holds."""
    path = f"{root}/{name}"
    for file, data in files.items():
        fs.pipe(f"{path}/{file}", data)
    return path, sum(len(data) for data in files.values())


def test_survey_reports_each_checkpoint_oldest_first(memfs: tuple[Any, str]) -> None:
    """OK, an unreadable marker, a bad shard, torn, written before checksums: each with its
    step, size and world size; names that are not step directories are skipped, and the
    directories after an unreadable one are still reported."""
    fs, root = memfs
    shards = {"__0_0.distcp": b"weights", ".metadata": b"meta"}
    fs.pipe(f"{root}/latest", b"step_000000050-eeeeee")  # sorts before every step directory

    def marker(world_size: int, files: dict[str, bytes] | None) -> bytes:
        body: dict[str, Any] = {"step": 0, "world_size": world_size}
        if files is not None:
            body["files"] = recorded(files)
        return json.dumps(body).encode()

    ok, ok_size = put_step(fs, root, "step_000000010-aaaaaa", {**shards, MARKER: marker(2, shards)})
    unreadable, unreadable_size = put_step(
        fs, root, "step_000000020-bbbbbb", {**shards, MARKER: b'{"files": '}
    )
    bad, bad_size = put_step(
        fs,
        root,
        "step_000000030-cccccc",
        {"__0_0.distcp": b"weightz", ".metadata": b"meta", MARKER: marker(8, shards)},
    )
    torn, torn_size = put_step(fs, root, "step_000000040-dddddd", shards)
    old, old_size = put_step(fs, root, "step_000000050-eeeeee", {**shards, MARKER: marker(4, None)})
    put_step(fs, root, "step_000000060-ffffff.corrupt", {**shards, MARKER: marker(2, shards)})

    not_json = (Mismatch(MARKER, "JSON", "unreadable"),)
    altered = (Mismatch("__0_0.distcp", f"sha256 {sha(b'weights')}", f"sha256 {sha(b'weightz')}"),)
    assert survey(fs, root) == [
        Entry(10, ok, "OK", ok_size, 2),
        Entry(20, unreadable, "CORRUPT", unreadable_size, None, not_json),
        Entry(30, bad, "CORRUPT", bad_size, 8, altered),
        Entry(40, torn, "TORN", torn_size, None),
        Entry(50, old, "UNVERIFIED", old_size, 4),
    ]
    assert ok_size == len(b"weights") + len(b"meta") + len(marker(2, shards))


def test_survey_of_a_missing_root_is_empty(memfs: tuple[Any, str], tmp_path: Path) -> None:
    fs, root = memfs
    assert survey(fs, f"{root}/absent") == []
    assert survey(fsspec.filesystem("file"), str(tmp_path / "absent")) == []


def test_survey_size_counts_the_files_not_a_subdirectory_entry(tmp_path: Path) -> None:
    """A local directory lists a subdirectory with a size of its own (4096 on ext4): it is
    not checkpoint data and is left out of the size."""
    step = tmp_path / "step_000000010-abcdef"
    (step / "extra").mkdir(parents=True)
    (step / "extra" / "notes.txt").write_bytes(b"not counted either")
    (step / "__0_0.distcp").write_bytes(b"weights")
    marker = json.dumps({"world_size": 1, "files": recorded({"__0_0.distcp": b"weights"})})
    (step / MARKER).write_text(marker)

    (entry,) = survey(fsspec.filesystem("file"), str(tmp_path))

    assert entry == Entry(10, str(step), "OK", len(b"weights") + len(marker), 1)


def test_set_aside_renames_a_local_checkpoint_and_keeps_every_file(tmp_path: Path) -> None:
    step = tmp_path / "step_000000020-abcdef"
    (step / "sub").mkdir(parents=True)
    (step / "__0_0.distcp").write_bytes(b"flipped shard")
    (step / "sub" / "extra").write_bytes(b"kept")

    inode = (step / "__0_0.distcp").stat().st_ino

    aside = set_aside(fsspec.filesystem("file"), f"{step}/")  # a trailing slash is no matter

    assert aside == f"{step}.corrupt"
    assert not step.exists()
    # Renamed, not copied: no second copy of a checkpoint on a disk that may be full.
    assert (Path(aside) / "__0_0.distcp").stat().st_ino == inode
    assert (Path(aside) / "__0_0.distcp").read_bytes() == b"flipped shard"
    assert (Path(aside) / "sub" / "extra").read_bytes() == b"kept"


def test_a_second_set_aside_gets_a_timestamped_name(tmp_path: Path) -> None:
    """The same step corrupt twice (saved again after the first was set aside): the second
    never lands inside the first, nor replaces it."""
    fs = fsspec.filesystem("file")
    step = tmp_path / "step_000000020-abcdef"
    step.mkdir()
    (step / "shard").write_bytes(b"first")
    first = set_aside(fs, str(step))
    step.mkdir()
    (step / "shard").write_bytes(b"second")

    before = int(time.time())
    second = set_aside(fs, str(step))
    after = int(time.time())

    assert first == f"{step}.corrupt"
    assert second in {f"{step}.corrupt-{t}" for t in range(before, after + 1)}
    assert (Path(first) / "shard").read_bytes() == b"first"
    assert sorted(p.name for p in Path(first).iterdir()) == ["shard"]
    assert (Path(second) / "shard").read_bytes() == b"second"
    assert not step.exists()


def test_set_aside_on_an_object_store_copies_every_object_then_deletes(
    memfs: tuple[Any, str],
) -> None:
    fs, root = memfs
    step = f"{root}/step_000000020-abcdef"
    objects = {"__0_0.distcp": b"flipped shard", ".metadata": b"meta", "sub/extra": b"kept"}
    for name, data in objects.items():
        fs.pipe(f"{step}/{name}", data)
    fs.pipe(f"{root}/step_000000010-abcdef/.metadata", b"older")

    aside = set_aside(fs, step)

    assert aside == f"{step}.corrupt"
    assert fs.find(root) == sorted(
        [f"{aside}/{name}" for name in objects] + [f"{root}/step_000000010-abcdef/.metadata"]
    )
    assert {name: fs.cat_file(f"{aside}/{name}") for name in objects} == objects
    assert not fs.exists(step)


MINE = {"job": "job-b", "workload": "digits", "model": "m2"}


def test_another_jobs_checkpoint_is_refused_with_the_fix() -> None:
    with pytest.raises(CheckpointMismatchError) as raised:
        check_identity(MINE, {"identity": {"job": "job-a"}}, root="/ckpt", step=20)
    assert str(raised.value) == (
        "the newest checkpoint in /ckpt (step 20) belongs to job job-a, not job-b: resuming "
        "from it would continue another job's training; give each job its own "
        "spec.checkpoint.dir"
    )


def test_another_models_checkpoint_is_refused_naming_both_workloads() -> None:
    theirs = {"identity": {"job": "job-b", "workload": "gpt2", "model": "m1"}}
    with pytest.raises(CheckpointMismatchError) as raised:
        check_identity(MINE, theirs, root="/ckpt", step=20)
    assert str(raised.value) == (
        "the newest checkpoint in /ckpt (step 20) was written by another model (gpt2, "
        "fingerprint m1) than this job's (digits, fingerprint m2): it cannot be loaded; use a "
        "new spec.checkpoint.dir, or run with --fresh to move the old ones aside"
    )


def test_a_model_mismatch_without_workload_names_shows_question_marks() -> None:
    with pytest.raises(CheckpointMismatchError) as raised:
        check_identity({"model": "m2"}, {"identity": {"model": "m1"}}, root="/ckpt", step=7)
    assert str(raised.value) == (
        "the newest checkpoint in /ckpt (step 7) was written by another model (?, "
        "fingerprint m1) than this job's (?, fingerprint m2): it cannot be loaded; use a "
        "new spec.checkpoint.dir, or run with --fresh to move the old ones aside"
    )


@pytest.mark.parametrize(
    ("mine", "marker"),
    [
        (MINE, {}),  # a marker from before identities
        (MINE, {"identity": {"workload": "gpt2"}}),
        ({}, {"identity": {"job": "job-a", "model": "m1"}}),  # a caller with no identity
        (MINE, {"identity": {"job": "job-b", "workload": "digits", "model": "m2"}}),
    ],
)
def test_an_identity_with_nothing_to_compare_or_the_same_is_accepted(
    mine: dict[str, str], marker: dict[str, Any]
) -> None:
    check_identity(mine, marker, root="/ckpt", step=20)  # raises nothing


def test_file_digests_record_every_file_but_the_marker_subdirectories_and_what_keep_drops(
    tmp_path: Path,
) -> None:
    files = {".metadata": b"meta", "__0_0.distcp": b"shard 0", "__1_0.distcp": b"shard 1"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / MARKER).write_text("{}")  # listed between .metadata and the shards
    (tmp_path / f"{MARKER}.tmp").write_text("{")  # the marker's temporary file
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x").write_bytes(b"x")
    (tmp_path / "rank1.log").write_bytes(b"not the checkpoint's")

    got = file_digests(fsspec.filesystem("file"), str(tmp_path), lambda n: n != "rank1.log")

    assert got == recorded(files)
    assert list(got) == sorted(files)


def test_a_listing_entry_is_named_by_its_last_part_however_it_is_written() -> None:
    # Object stores list a prefix with or without a trailing slash, a local root without one.
    assert base_name("bucket/ckpt/step_000000001-abcdef/") == "step_000000001-abcdef"
    assert base_name("/ckpt/step_000000001-abcdef") == "step_000000001-abcdef"
    assert base_name("step_000000001-abcdef") == "step_000000001-abcdef"
    assert base_name("/ckpt/rank_X") == "rank_X"
    assert join("s3://bucket/ckpt/", "step") == "s3://bucket/ckpt/step"
    assert join("/ckpt", "step") == "/ckpt/step"
    assert join("/ckptX", "step") == "/ckptX/step"


def write_marker(fs: Any, directory: str, marker: Any) -> None:
    fs.pipe(f"{directory}/{MARKER}", json.dumps(marker).encode())


def test_owner_is_the_markers_job_or_none_when_it_cannot_say(memfs: tuple[Any, str]) -> None:
    fs, root = memfs
    cases: dict[str, Any] = {
        "named": {"identity": {"job": "job-a", "model": "m1"}},
        "no-job": {"identity": {"model": "m1"}},
        "empty-job": {"identity": {"job": ""}},
        "identity-not-a-mapping": {"identity": "job-a"},
        "before-identities": {"files": {}},
    }
    for name, marker in cases.items():
        write_marker(fs, f"{root}/{name}", marker)
    fs.pipe(f"{root}/unreadable/{MARKER}", b"{torn")
    assert {name: owner(fs, f"{root}/{name}") for name in [*cases, "unreadable", "torn"]} == {
        "named": "job-a", "no-job": None, "empty-job": None, "identity-not-a-mapping": None,
        "before-identities": None, "unreadable": None, "torn": None,
    }  # fmt: skip


def test_set_aside_takes_any_directory_name(tmp_path: Path) -> None:
    step = tmp_path / "stepX"
    step.mkdir()
    (step / "shard").write_bytes(b"kept")
    aside = set_aside(fsspec.filesystem("file"), str(step))
    assert aside == f"{step}.corrupt"
    assert (Path(aside) / "shard").read_bytes() == b"kept"
