"""The digits data set without torch: scikit-learn's 8x8 digits, cached, and the one train/test
split every framework's digits workload uses (PyTorch's in ``digits``, TensorFlow's and Ray's in
``gpufleet.frameworks``), and the global batches of the latter."""

from __future__ import annotations

import contextlib
import io
import zipfile
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.extras import missing
from gpufleet.runtime.context import cache_dir
from gpufleet.runtime.files import write_bytes_atomic

TEST_FRACTION = 0.2
# The training recipe of every digits workload (PyTorch's digits_recipe, TensorFlow's in Keras)
# and of `gpufleet bench training`: SGD with momentum, cosine decay to zero.
OPTIMIZER, MOMENTUM, LR_SCHEDULE = "sgd", 0.9, "cosine"
Arrays = tuple[npt.NDArray[Any], npt.NDArray[Any]]


def digits_arrays() -> Arrays:
    """scikit-learn's digits as it loads them (images 1797 x 8 x 8, targets), kept in the cache
    directory by the first call on a machine: importing scikit-learn costs each worker process
    about a second of CPU, more than a short job's training. The file is named by
    scikit-learn's version; one that is unreadable or damaged (a zip CRC) is loaded anew."""
    try:
        sklearn = version("scikit-learn")
    except PackageNotFoundError:
        raise missing("digits", "scikit-learn", "the digits workload") from None
    cached = cache_dir() / f"digits-scikit-learn-{sklearn}.npz"
    try:  # our own handle: np.load given a path leaves it open when the zip is damaged
        with cached.open("rb") as fh, np.load(fh, allow_pickle=False) as f:
            images, target = f["images"], f["target"]
        if images.shape == (len(target), 8, 8):
            return images, target
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass
    from sklearn.datasets import load_digits

    bunch: Any = load_digits()
    npz = io.BytesIO()
    np.savez(npz, images=bunch.images, target=bunch.target)
    with contextlib.suppress(OSError):  # a read-only home (a pod's): load it every time
        write_bytes_atomic(cached, npz.getvalue())
    return bunch.images, bunch.target


def digits_split(
    seed: int = 0,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[Any], npt.NDArray[Any]]:
    """(images scaled to [0,1] as float32 N x 8 x 8, labels as int64, train indices, test
    indices): the split fixed by ``seed``."""
    raw_images, raw_labels = digits_arrays()
    images = np.asarray(raw_images, dtype=np.float32) / 16.0
    labels = np.asarray(raw_labels, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(len(labels) * TEST_FRACTION)
    return images, labels, order[n_test:], order[:n_test]


def batch_indices(train: npt.NDArray[Any], seed: int, step: int, global_batch: int) -> Any:
    """The training indices of (0-based) ``step``'s global batch: epoch ``e`` draws its order
    from ``seed + e``; a pure function of its arguments, so a resumed run sees the same data."""
    per_epoch = max(1, len(train) // global_batch)
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng(seed + epoch).permutation(len(train))
    if len(order) < global_batch:  # a batch larger than the data set: repeat it
        order = np.resize(order, global_batch)
    return train[order[position * global_batch : (position + 1) * global_batch]]
