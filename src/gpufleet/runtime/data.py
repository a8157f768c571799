"""A distributed sampler that can resume in the middle of an epoch."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler


class ResumableDistributedSampler(Sampler[int]):
    """torch's DistributedSampler, plus a position inside the epoch that a checkpoint keeps.

    The indices of an epoch come from DistributedSampler (same seed, same shards); iteration
    starts ``start_index`` samples in, so a resumed run sees exactly the samples the interrupted
    one had not seen yet.
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        self._inner: DistributedSampler[int] = DistributedSampler(
            dataset,  # type: ignore[arg-type]  # only len() is used
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.epoch = 0
        self.start_index = 0

    def set_epoch(self, epoch: int, start_index: int = 0) -> None:
        """Select the epoch (its shuffle) and where in it to start."""
        self.epoch = epoch
        self.start_index = start_index
        self._inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(self._inner)
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return max(0, len(self._inner) - self.start_index)

    def samples_per_epoch(self) -> int:
        """Samples this rank sees in a whole epoch."""
        return len(self._inner)


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches of indices, cut from one global order of the data.

    Each epoch is one permutation of the whole data set (seeded by ``seed + epoch``, as
    DistributedSampler seeds it). Step ``s`` of an epoch takes the ``global_batch`` indices at
    ``s * global_batch``; rank ``r`` of ``W`` takes its contiguous ``global_batch / W`` of them,
    split into ``micro_batches`` equal micro-batches. What a step trains on therefore depends
    on the global batch only, not on the world size: the position a checkpoint keeps (epoch,
    step in epoch) means the same samples at any world size that divides the global batch, so
    a resume at another world size skips and repeats nothing. Drops the last partial global
    batch of an epoch.
    """

    def __init__(
        self,
        size: int,
        *,
        global_batch: int,
        num_replicas: int,
        rank: int,
        micro_batches: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        share = num_replicas * micro_batches
        if global_batch < 1 or global_batch % share:
            raise ValueError(f"a global batch of {global_batch} does not split into "
                             f"{num_replicas} ranks x {micro_batches} micro-batches")  # fmt: skip
        self.size = size
        self.global_batch = global_batch
        self.rank_batch = global_batch // num_replicas
        self.micro = self.rank_batch // micro_batches
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.start_step = 0
        self.taken: list[int] = []  # indices yielded and not yet claimed by take()

    @property
    def steps_per_epoch(self) -> int:
        """Whole global batches in an epoch."""
        return self.size // self.global_batch

    def set_position(self, epoch: int, step_in_epoch: int) -> None:
        """Start at step ``step_in_epoch`` of ``epoch``."""
        self.epoch, self.start_step = epoch, step_in_epoch

    def order(self, epoch: int) -> list[int]:
        """The global order of the data in ``epoch``."""
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        for step in range(self.start_step, self.steps_per_epoch):
            begin = step * self.global_batch + self.rank * self.rank_batch
            mine = order[begin : begin + self.rank_batch]
            for at in range(0, self.rank_batch, self.micro):
                micro = mine[at : at + self.micro]
                self.taken += micro
                yield micro

    def __len__(self) -> int:
        return max(0, self.steps_per_epoch - self.start_step) * (self.rank_batch // self.micro)

    def take(self) -> list[int]:
        """The indices yielded since the last call (a step's samples, for the sample log)."""
        out, self.taken = self.taken, []
        return out


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``: tensors moved (without blocking), lists, tuples and dicts of
    them walked, anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
