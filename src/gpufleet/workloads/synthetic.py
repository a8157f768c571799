"""Built-in workload: an MLP on random data with a configurable size, for benchmarks."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def synthetic_dataset(
    samples: int, input_size: int, classes: int = 10, seed: int = 0
) -> TensorDataset:
    """``samples`` random inputs with random labels, fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, input_size, generator=g)
    y = torch.randint(0, classes, (samples,), generator=g)
    return TensorDataset(x, y)


def synthetic_mlp(
    input_size: int, hidden_size: int, layers: int, classes: int = 10
) -> nn.Sequential:
    """``layers`` hidden Linear+ReLU blocks of ``hidden_size``, then a classifier."""
    blocks: list[nn.Module] = []
    width = input_size
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden_size), nn.ReLU()]
        width = hidden_size
    blocks.append(nn.Linear(width, classes))
    return nn.Sequential(*blocks)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of all parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
