"""A distributed sampler that can resume in the middle of an epoch."""

from __future__ import annotations

from collections.abc import Iterator, Sized

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
