"""The real-node tests' local reference runs (tests/support/references.py), with small real
runs: a queued shape runs in the test that asks for it, a running one is waited for, each
shape runs once, a stop leaves no process behind, and a later session reads a shape's result
from disk unless something that decides it changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.runtime.context import ENV_CACHE_DIR
from tests.support import refcache, references
from tests.support.procs import poll_until

FIRST, SECOND = (1, 1, 4, 2, "pytorch"), (1, 1, 6, 2, "pytorch")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No run of another test remembered, in this process or on disk."""
    monkeypatch.setattr(references, "_RUNS", references._Runs())
    monkeypatch.setenv(refcache.CACHE_ENV, str(tmp_path / "cache"))


def ran_in(root: Path) -> set[str]:
    """The jobs `gpufleet run` ran in ``root``."""
    runs = root / ".gpufleet" / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.exists() else set()


def test_each_shape_runs_once_in_the_background_or_in_the_test_that_asks_first(
    workdir: Path,
) -> None:
    background, asked = workdir / "background", workdir / "asked"
    background.mkdir()
    asked.mkdir()
    references.prefetch(background, [FIRST, SECOND])
    try:
        second = references.local_digest(asked, *SECOND[:4])  # queued behind FIRST: run here
        first = references.local_digest(asked, *FIRST[:4])  # the background's: waited for
        assert references.local_digest(asked, *SECOND[:4]) == second  # remembered
    finally:
        references.stop_prefetch()
    assert first != second  # 4 and 6 steps of training
    assert ran_in(background) == {"local-pytorch-1x1-4-2"}
    assert ran_in(asked) == {"local-pytorch-1x1-6-2"}


def test_a_stop_ends_the_running_reference_and_the_queued_ones_never_start(
    workdir: Path,
) -> None:
    references.prefetch(workdir, [FIRST, SECOND])
    proc = poll_until(lambda: references._RUNS.running.get(FIRST), what="the first run")
    references.stop_prefetch()
    assert proc.poll() is not None and not references._RUNS.queued
    assert ran_in(workdir) <= {"local-pytorch-1x1-4-2"}  # the workdir fixture: no process left


def test_a_later_session_reads_the_result_from_disk_unless_an_input_changed(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for root in ("one", "three"):
        (workdir / root).mkdir()
    first = references.local_digest(workdir / "one", *FIRST[:4])
    monkeypatch.setattr(references, "_RUNS", references._Runs())  # the next session
    references.prefetch(workdir / "two", [FIRST])
    try:
        assert references.local_digest(workdir / "two", *FIRST[:4]) == first
    finally:
        references.stop_prefetch()
    assert not (workdir / "two").exists()  # nothing ran, not even in the background
    monkeypatch.setattr(references, "_RUNS", references._Runs())
    monkeypatch.setattr(refcache, "machine_and_code", lambda: "another torch, or another CPU")
    assert references.local_digest(workdir / "three", *FIRST[:4]) == first
    assert ran_in(workdir / "three") == {"local-pytorch-1x1-4-2"}


def test_the_key_is_the_spec_and_not_where_it_checkpoints() -> None:
    here, there = references._doc(Path("/a"), FIRST), references._doc(Path("/b"), FIRST)
    assert here != there and refcache.key(here) == refcache.key(there)
    assert refcache.key(references._doc(Path("/a"), SECOND)) != refcache.key(here)


def test_the_key_is_not_where_the_session_keeps_its_data_but_is_each_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each session caches the digits arrays in a directory of its own (GPUFLEET_CACHE_DIR):
    in the key, no session would read an earlier one's run."""
    doc = references._doc(Path("/a"), FIRST)

    def key_with(name: str, value: str) -> str:
        monkeypatch.setenv(name, value)
        refcache.machine_and_code.cache_clear()
        return refcache.key(doc)

    try:
        one = key_with(ENV_CACHE_DIR, "/tmp/pytest-1/gpufleet-cache0")
        assert key_with(ENV_CACHE_DIR, "/tmp/pytest-2/gpufleet-cache0") == one
        assert key_with("OMP_NUM_THREADS", "3") != one
    finally:
        monkeypatch.undo()
        refcache.machine_and_code.cache_clear()
