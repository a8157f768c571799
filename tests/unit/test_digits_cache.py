"""The built-in digits data comes from scikit-learn once per machine, then from gpufleet's cache:
the same arrays, no scikit-learn import in the workers, a damaged file loaded anew, and a cache
that cannot be written costs nothing but the time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from gpufleet.runtime.context import ENV_CACHE_DIR, cache_dir
from gpufleet.workloads.digits import digits_arrays, digits_datasets


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def the_file(cache: Path) -> Path:
    (found,) = cache.glob("digits-scikit-learn-*.npz")
    return found


def assert_scikit_learns(images: np.ndarray, target: np.ndarray) -> None:
    bunch = load_digits()
    assert images.dtype == bunch.images.dtype and target.dtype == bunch.target.dtype
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)


def test_the_first_load_fills_the_cache_and_the_second_reads_the_same_arrays(cache: Path) -> None:
    assert_scikit_learns(*digits_arrays())
    assert not list(cache.glob(".*.tmp"))  # written aside and renamed
    the_file(cache).touch()
    assert_scikit_learns(*digits_arrays())


def test_the_splits_are_the_same_from_the_cache(cache: Path) -> None:
    fresh = digits_datasets(3)
    assert the_file(cache).is_file()
    again = digits_datasets(3)
    for a, b in zip(fresh, again, strict=True):
        for x, y in zip(a.tensors, b.tensors, strict=True):
            assert torch.equal(x, y)


def test_a_worker_with_the_cache_filled_never_imports_scikit_learn(cache: Path) -> None:
    digits_arrays()
    probe = (
        "import sys; from gpufleet.workloads.digits import digits_datasets; digits_datasets(0); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))"
    )
    env = os.environ | {ENV_CACHE_DIR: str(cache)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("damage", ["truncated", "flipped", "wrong-shape", "empty"])
def test_a_damaged_cache_file_is_loaded_anew(cache: Path, damage: str) -> None:
    digits_arrays()
    path = the_file(cache)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":  # a byte of the images' stored data: the zip CRC no longer holds
        at = data.index(b"images.npy") + 400
        path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    elif damage == "wrong-shape":
        np.savez(path, images=np.zeros((3, 8)), target=np.zeros(4))
    else:
        path.write_bytes(b"")
    assert_scikit_learns(*digits_arrays())
    assert_scikit_learns(*digits_arrays())  # and the file is whole again


def test_a_cache_that_cannot_be_written_still_loads(cache: Path) -> None:
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("a file where the directory should be")
    assert_scikit_learns(*digits_arrays())
    assert cache.read_text() == "a file where the directory should be"


def test_the_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CACHE_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert cache_dir() == Path("/x/cache/gpufleet")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert cache_dir() == Path("/home/u/.cache/gpufleet")
    monkeypatch.setenv(ENV_CACHE_DIR, "/elsewhere")
    assert cache_dir() == Path("/elsewhere")
