"""Built-in workload: a small CNN on scikit-learn's bundled 8x8 digits (real data, no download)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy.typing as npt
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gpufleet.workloads.digits_data import MOMENTUM, digits_split
from gpufleet.workloads.digits_data import digits_arrays as digits_arrays


def digits_datasets(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) split of the 1,797 digits images, fixed by ``seed``; pixels scaled to [0,1]."""
    images, labels, train, test = digits_split(seed)

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
