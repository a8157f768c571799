"""Resume, also at another world size: what a Trainer checkpoints (``Progress``, and
``JobState``: the DCP Stateful of model, optimizer, scheduler, position and RNG), how a global
batch is cut into this world size's data (``global_batch_loader``), why it cannot be
(``unsplittable``), and what a resized resume tells the user (``resized_note``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import DataLoader, Dataset

from gpufleet.errors import JobConfigError, ReshardError
from gpufleet.runtime.checkpoint import CheckpointRef
from gpufleet.runtime.data import GlobalBatchSampler
from gpufleet.runtime.distributed import DistInfo
from gpufleet.runtime.rng import capture_rng, restore_rng


@dataclass
class Progress:
    """Where training stands; every rank holds the same."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # steps (global batches) done in this epoch
    global_batch: int = 0  # samples per step over all ranks, fixed by the first run
    shards: int = 0  # exact mode's shards per step (gpufleet.runtime.exact), fixed so too

    def settle(self, first_batch: int, exact_shards: int) -> None:
        """After a load: ``first_batch`` (the writer's world size times the batch size) for a
        checkpoint written before the global batch was kept; exact mode as the job asks
        (``exact_shards``), in the checkpoint's own shards when it has some."""
        self.global_batch = self.global_batch or first_batch
        self.shards = (self.shards or exact_shards) if exact_shards else 0

    def advance(self, steps_per_epoch: int) -> None:
        """One step done; a new epoch after ``steps_per_epoch`` of them."""
        self.step += 1
        self.batch_in_epoch += 1
        if self.batch_in_epoch == steps_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0


class Trained(Protocol):
    """What JobState reads from and loads into (the Trainer)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    progress: Progress
    info: DistInfo


class JobState(Stateful):
    """Everything exact resume needs, as one DCP Stateful: DCP calls these on save and load."""

    def __init__(self, trainer: Trained) -> None:
        self.t = trainer
        # False when resuming at a world size the checkpoint has no RNG state for this rank.
        self.with_rng = True
        # The keys of progress a checkpoint written before they existed lacks.
        self.absent: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, scheduler, progress and (``with_rng``) this rank's RNG states."""
        t = self.t
        model_sd, optim_sd = get_state_dict(t.model, t.optimizer)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": t.scheduler.state_dict() if t.scheduler else {},
            "progress": dict(t.progress.__dict__),
        }
        for key in self.absent:
            del state["progress"][key]
        if self.with_rng:
            # Each rank's generators differ (seeded by rank), so each rank keeps its own key;
            # a shared key would be deduplicated by DCP and saved by one rank only.
            state[f"rng_rank{t.info.rank}"] = capture_rng()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what ``state_dict`` saved into the trainer, in place."""
        t = self.t
        set_state_dict(
            t.model,
            t.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if t.scheduler is not None:
            t.scheduler.load_state_dict(state_dict["scheduler"])
        t.progress = Progress(**state_dict["progress"])  # an absent key: its default, 0
        if self.with_rng:
            restore_rng(state_dict[f"rng_rank{t.info.rank}"])


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def unsplittable(global_batch: int, world: int, micro: int, ref: CheckpointRef | None) -> str:
    """Why ``world`` workers with ``micro`` micro-batches cannot continue ``ref``, and what
    would."""
    written = f" (written by {_plural(ref.world_size, 'worker')})" if ref and ref.world_size else ""
    fits = [n for n in range(1, global_batch + 1) if global_batch % (n * micro) == 0]
    fix = (
        f"resume with a world size among {', '.join(map(str, fits[:12]))}"
        f"{', ...' if len(fits) > 12 else ''}"
        if fits
        else f"no world size can with {micro} micro-batches: set "
        f"spec.parallelism.gradientAccumulation to a divisor of {global_batch}"
    )
    return (
        f"the checkpoint of step {ref.step if ref else 0}{written} trains with a global batch "
        f"of {global_batch} samples per step, which {_plural(world, 'worker')} x "
        f"{_plural(micro, 'micro-batch')} cannot split evenly: {fix}"
    ).replace("micro-batchs", "micro-batches")


def unshardable(shards: int, world: int, ref: CheckpointRef | None) -> str:
    """Why ``world`` workers cannot train exactly with ``shards`` per step, and what could."""
    written = f" of step {ref.step}" if ref else ""
    fits = [n for n in range(1, shards + 1) if shards % n == 0]
    return (
        f"the checkpoint{written} trains exactly across world sizes with {shards} shards per "
        f"step (spec.parallelism.shards), which {_plural(world, 'worker')} cannot split "
        f"evenly: resume with a world size among {', '.join(map(str, fits))}"
    )


def global_batch_loader(
    data: Dataset[Any],
    *,
    global_batch: int,
    world: int,
    rank: int,
    micro: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    shards: int = 0,
    ref: CheckpointRef | None = None,
) -> tuple[GlobalBatchSampler, DataLoader[Any]]:
    """Cut ``data`` into steps of ``global_batch`` samples over ``world`` ranks of ``micro``
    micro-batches each (exact mode, ``shards`` > 0: shards / world, one shard each): this rank's
    sampler and loader. Raises ReshardError when the world cannot split the batch (or the
    shards) of ``ref`` (the checkpoint resumed), JobConfigError when one global batch
    (``batch_size`` per worker) is more than the data."""
    if shards:
        if shards % world:
            raise ReshardError(unshardable(shards, world, ref))
        micro = shards // world
    if global_batch % (world * micro):
        raise ReshardError(unsplittable(global_batch, world, micro, ref))
    size = len(data)  # type: ignore[arg-type]  # a map-style data set
    sampler = GlobalBatchSampler(
        size,
        global_batch=global_batch,
        num_replicas=world,
        rank=rank,
        micro_batches=micro,
        shuffle=shuffle,
        seed=seed,
    )
    loader = DataLoader(
        data,
        batch_sampler=sampler,
        num_workers=0,
        # A private generator: creating a loader iterator draws a seed from it, and that
        # draw must not move the global RNG a resumed run restores.
        generator=torch.Generator().manual_seed(seed),
    )
    if sampler.steps_per_epoch == 0:
        raise JobConfigError(
            f"a global batch of {global_batch} ({batch_size} per worker) is "
            f"larger than the data ({size} samples)"
        )
    return sampler, loader


def resized_note(ref: CheckpointRef, world: int, progress: Progress) -> str:
    """What a resume of ``ref`` at ``world`` ranks, another world size than its writer's,
    does to the batch, the samples and the weights."""
    batch = progress.global_batch
    weights = (
        f"in {progress.shards} shards per step, summed in a fixed order: weights equal an "
        "uninterrupted run's bit for bit"
        if progress.shards
        else "weights match an uninterrupted run up to reduction order, not bit for bit"
    )
    return (
        f"gpufleet: checkpoint written by {ref.world_size} processes, resuming with "
        f"{world}: model and optimizer resharded; the global batch stays {batch} "
        f"({batch // world} per worker) and no sample is skipped or repeated; {weights}"
    )
