"""Checkpointer on one process: new directory per step, markers, torn directories, keep-last-K."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gpufleet.runtime.checkpoint import MARKER, Checkpointer


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
