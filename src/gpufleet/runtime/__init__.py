"""Code that runs inside workers: process groups, checkpoints, data, the Trainer, watchdogs."""

from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef
from gpufleet.runtime.context import JobContext
from gpufleet.runtime.data import ResumableDistributedSampler
from gpufleet.runtime.digest import state_digest
from gpufleet.runtime.distributed import (
    DistInfo,
    barrier,
    init_distributed,
    shutdown_distributed,
)
from gpufleet.runtime.preemption import PreemptionGuard
from gpufleet.runtime.rng import capture_rng, restore_rng, seed_everything
from gpufleet.runtime.trainer import Trainer, TrainerConfig, TrainResult
from gpufleet.runtime.watchdog import HangWatchdog

__all__ = [
    "CheckpointRef",
    "Checkpointer",
    "DistInfo",
    "HangWatchdog",
    "JobContext",
    "PreemptionGuard",
    "ResumableDistributedSampler",
    "TrainResult",
    "Trainer",
    "TrainerConfig",
    "barrier",
    "capture_rng",
    "init_distributed",
    "restore_rng",
    "seed_everything",
    "shutdown_distributed",
    "state_digest",
]
