"""Every RNG a training step may draw from, captured and restored for exact resume."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and CUDA) global generators."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    # Run on a GPU only: tests/unit/test_runtime_misc.py::test_a_gpu_worker_gets_its_local_rank_*
    if torch.cuda.is_available():  # pragma: no cover - GPU only
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what capture_rng returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # pragma: no cover - GPU only, as above
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) with one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
