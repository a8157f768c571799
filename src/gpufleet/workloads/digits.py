"""Built-in workload: a small CNN on scikit-learn's bundled 8x8 digits (real data, no download)."""

from __future__ import annotations

import contextlib
import io
import zipfile
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gpufleet.runtime.context import cache_dir
from gpufleet.runtime.files import write_bytes_atomic

TEST_FRACTION = 0.2
# The training recipe (digits_recipe), shared by the workload and `gpufleet bench training`.
OPTIMIZER, MOMENTUM, LR_SCHEDULE = "sgd", 0.9, "cosine"
Arrays = tuple[npt.NDArray[Any], npt.NDArray[Any]]


def digits_arrays() -> Arrays:
    """scikit-learn's digits as it loads them (images 1797 x 8 x 8, targets), kept in the cache
    directory by the first call on a machine: importing scikit-learn costs each worker process
    about a second of CPU, more than a short job's training. The file is named by
    scikit-learn's version; one that is unreadable or damaged (a zip CRC) is loaded anew."""
    cached = cache_dir() / f"digits-scikit-learn-{version('scikit-learn')}.npz"
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


def digits_datasets(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) split of the 1,797 digits images, fixed by ``seed``; pixels scaled to [0,1]."""
    raw_images, raw_labels = digits_arrays()
    images = np.asarray(raw_images, dtype=np.float32) / 16.0
    labels = np.asarray(raw_labels, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(len(labels) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]

    def tensors(idx: npt.NDArray[Any]) -> TensorDataset:
        x = torch.from_numpy(images[idx]).unsqueeze(1)  # N x 1 x 8 x 8
        return TensorDataset(x, torch.from_numpy(labels[idx]))

    return tensors(train), tensors(test)


class DigitsCNN(nn.Module):
    """Two conv layers, max-pool, dropout, two linear layers: ~20k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.25),  # draws from the RNG, so exact resume must restore it
            nn.Linear(32 * 4 * 4, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset) -> float:
    """Top-1 accuracy of ``model`` on ``data`` (eval mode, no gradients)."""
    was_training = model.training
    model.eval()
    x, y = data.tensors
    device = next(model.parameters()).device
    pred = model(x.to(device)).argmax(dim=1).cpu()
    model.train(was_training)
    return float((pred == y).float().mean().item())


@dataclass
class DigitsRecipe:
    """What training the digits CNN starts from: the model, SGD with momentum, cosine decay."""

    model: DigitsCNN
    optimizer: torch.optim.SGD
    scheduler: torch.optim.lr_scheduler.CosineAnnealingLR


def digits_recipe(*, lr: float, steps: int, seed: int) -> DigitsRecipe:
    """The one digits recipe: seeds every RNG with ``seed`` (the same initial weights on every
    rank), then the CNN, SGD (momentum MOMENTUM) at ``lr`` decayed to zero over ``steps`` by a
    cosine schedule. The data split is the caller's (digits_datasets), drawn before this."""
    from gpufleet.runtime.rng import seed_everything

    seed_everything(seed)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    return DigitsRecipe(model, opt, sched)
