"""Code that runs inside workers: process groups, checkpoints, data, the Trainer, watchdogs.

Names are imported on first use (PEP 562), so light modules of this package (``context``,
``files``) do not pull in torch: the CLI, the renderers and the GPU exporter import them, and
the exporter must stay small (an exporter that imports torch holds ~280 MB).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef
    from gpufleet.runtime.context import CheckpointSettings, JobContext, ParallelismSettings
    from gpufleet.runtime.data import GlobalBatchSampler, ResumableDistributedSampler
    from gpufleet.runtime.digest import state_digest
    from gpufleet.runtime.distributed import (
        DistInfo,
        barrier,
        init_distributed,
        shutdown_distributed,
    )
    from gpufleet.runtime.preemption import PreemptionGuard
    from gpufleet.runtime.reporting import TrainResult
    from gpufleet.runtime.rng import capture_rng, restore_rng, seed_everything
    from gpufleet.runtime.rundir import RunDir
    from gpufleet.runtime.trainer import Trainer, TrainerConfig
    from gpufleet.runtime.watchdog import HangWatchdog, heartbeat

_WHERE = {
    "CheckpointRef": "checkpoint",
    "CheckpointSettings": "context",
    "Checkpointer": "checkpoint",
    "DistInfo": "distributed",
    "GlobalBatchSampler": "data",
    "HangWatchdog": "watchdog",
    "JobContext": "context",
    "ParallelismSettings": "context",
    "PreemptionGuard": "preemption",
    "ResumableDistributedSampler": "data",
    "RunDir": "rundir",
    "TrainResult": "reporting",
    "Trainer": "trainer",
    "TrainerConfig": "trainer",
    "barrier": "distributed",
    "capture_rng": "rng",
    "heartbeat": "watchdog",
    "init_distributed": "distributed",
    "restore_rng": "rng",
    "seed_everything": "rng",
    "shutdown_distributed": "distributed",
    "state_digest": "digest",
}

__all__ = [
    "CheckpointRef",
    "CheckpointSettings",
    "Checkpointer",
    "DistInfo",
    "GlobalBatchSampler",
    "HangWatchdog",
    "JobContext",
    "ParallelismSettings",
    "PreemptionGuard",
    "ResumableDistributedSampler",
    "RunDir",
    "TrainResult",
    "Trainer",
    "TrainerConfig",
    "barrier",
    "capture_rng",
    "heartbeat",
    "init_distributed",
    "restore_rng",
    "seed_everything",
    "shutdown_distributed",
    "state_digest",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
