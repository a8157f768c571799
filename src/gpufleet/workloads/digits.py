"""Built-in workload: a small CNN on scikit-learn's bundled 8x8 digits (real data, no download)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

TEST_FRACTION = 0.2


def digits_datasets(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) split of the 1,797 digits images, fixed by ``seed``; pixels scaled to [0,1]."""
    bunch: Any = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0
    labels = np.asarray(bunch.target, dtype=np.int64)
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
