"""Training that ends with the same weights, bit for bit, at every world size that divides a
fixed number of virtual shards (spec.parallelism.exactAcrossWorldSizes; docs/parallelism.md).

Floating-point addition is not associative, so a gradient summed over 2 workers differs in its
last bits from the same gradient summed over 4. Here the order of every sum is fixed by the
shard, never by the rank:

- each step's global batch is cut into V shards (V a power of two); rank r of W computes the
  gradient of its V/W contiguous shards one at a time, each on its own (a shard has the same
  samples, size and random seed at every world size, so the same gradient bit for bit);
- the V gradients are added in one fixed pairwise tree (``PairwiseSum``): its leaves are the
  shards in order, so each rank's contiguous block is one subtree, which the rank adds alone;
- across ranks, a DDP communication hook (``ExactReducer.hook``) all-gathers the W subtree sums
  and adds them in the same tree, identically on every rank, then scales by 1/V (a power of
  two: exact). At world size 1 the rank adds the whole tree itself.

DDP's own all-reduce cannot be used: its reduction order depends on the backend, the world size
and the algorithm it picks. PyTorch has no order-fixed reduction to call, so the tree is here.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from gpufleet import torchapi

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket


class PairwiseSum:
    """Adds tensors pushed in order in a balanced binary tree: ((a + b) + (c + d)) for four.
    A stack of partial sums, each with its level (log2 of the leaves it holds), merged when two
    of one level meet: at most log2(n) + 1 tensors are held. ``total`` needs a power-of-two
    count, so that every ordered block of 2^k leaves is one subtree."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, torch.Tensor]] = []

    def push(self, value: torch.Tensor) -> None:
        level = 0
        while self._stack and self._stack[-1][0] == level:
            _, left = self._stack.pop()
            value = left + value  # left subtree first: the same order everywhere
            level += 1
        self._stack.append((level, value))

    def __len__(self) -> int:
        return len(self._stack)

    def total(self) -> torch.Tensor:
        if len(self._stack) != 1:
            raise ValueError(f"a pairwise sum of a count that is no power of two ({self._stack})")
        return self._stack.pop()[1]


def tree_sum(values: list[torch.Tensor]) -> torch.Tensor:
    """``values`` (a power-of-two count) added in PairwiseSum's tree."""
    tree = PairwiseSum()
    for value in values:
        tree.push(value)
    return tree.total()


def shard_seed(seed: int, step: int, shard: int) -> int:
    """The seed of a shard's random draws (dropout) at ``step``: the same at every world size,
    whichever rank computes the shard. A hash, so nearby steps and shards draw unrelated
    streams."""
    digest = hashlib.sha256(f"{seed}/{step}/{shard}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # torch.manual_seed takes < 2**63


class ExactReducer:
    """The per-step state of exact training on one rank: the pairwise sums of its shards'
    gradients, parameter by parameter, completed and combined across ranks by ``hook``.

    For the benchmark: ``bytes_moved``, what this rank's gathers sent and received;
    ``peak_tree_bytes``, the most gradient bytes the tree held at once beside the model's."""

    def __init__(self, model: nn.Module, shards: int, world: int, rank: int) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._grad_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.world, self.rank = world, rank
        self.shards, self.per_rank = shards, shards // world  # checked by use()
        self._sums: dict[int, PairwiseSum] = {}
        self.bytes_moved = self.peak_tree_bytes = 0

    def use(self, shards: int) -> None:
        """Train with ``shards`` per step (a resumed checkpoint's own); the world size must
        divide it (the Trainer says so first, in one line)."""
        if shards % self.world:
            raise ValueError(f"{self.world} ranks do not divide {shards} shards")
        self.shards, self.per_rank = shards, shards // self.world

    @contextlib.contextmanager
    def seeded(self, seed: int, step: int, index: int) -> Iterator[None]:
        """Random draws of this rank's ``index``-th shard of ``step`` from the shard's own seed;
        the rank's generators are left as they were."""
        device = self.params[0].device if self.params else torch.device("cpu")
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(shard_seed(seed, step, self.rank * self.per_rank + index))
            yield

    def keep(self) -> None:
        """After a shard's backward that was not reduced: add its gradients to the sums and
        clear them for the next shard."""
        for p in self.params:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            self._sums.setdefault(id(p), PairwiseSum()).push(grad)
            p.grad = None
        if self.params:  # every parameter's tree holds as many partial sums as the first's
            held = len(self._sums[id(self.params[0])]) * self._grad_bytes
            self.peak_tree_bytes = max(self.peak_tree_bytes, held)

    def costs(self, steps: int) -> dict[str, float]:
        """What the mode cost per step, for the job's result."""
        return {"exact_bytes_moved_per_step": self.bytes_moved / max(steps, 1),
                "exact_tree_bytes": float(self.peak_tree_bytes)}  # fmt: skip

    def _local(self, p: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        """This rank's subtree for ``p``: its kept shards and the ``last`` one's gradient."""
        tree = self._sums.pop(id(p), PairwiseSum())
        if last is not None:
            tree.push(last)
        return tree.total()

    def finish_alone(self) -> None:
        """World size 1: the whole tree is this rank's; set each gradient to its mean."""
        for p in self.params:
            p.grad = self._local(p, None).mul_(1.0 / self.shards)

    def hook(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's communication hook (``register``): the bucket holds the last shard's
        gradients; complete each parameter's subtree, gather every rank's, add them in the
        tree, scale to the mean."""
        pairs = zip(bucket.parameters(), bucket.gradients(), strict=True)
        local = torch.cat([self._local(p, g).flatten() for p, g in pairs])
        gathered = torch.empty(self.world * local.numel(), dtype=local.dtype, device=local.device)
        gather, _ = torchapi.single_tensor_fns(dist)
        work = gather(gathered, local, async_op=True)
        self.bytes_moved += 2 * (self.world - 1) * local.numel() * local.element_size()
        scale = 1.0 / self.shards

        def combine(_: torch.futures.Future[Any]) -> torch.Tensor:
            return tree_sum(list(gathered.chunk(self.world))).mul_(scale)

        return work.get_future().then(combine)  # type: ignore[no-any-return]

    def register(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """Make ``hook`` ``ddp``'s communication hook. DDP checks a hook's annotations against
        the classes themselves, which this module's postponed (string) annotations are not:
        hence the plain lambda."""
        ddp.register_comm_hook(None, lambda state, bucket: self.hook(bucket))


def exact_step(
    reducer: ExactReducer,
    batches: list[Any],
    *,
    seed: int,
    step: int,
    loss_of: Callable[[Any, bool], torch.Tensor],
    micro_batch: Callable[[bool], contextlib.AbstractContextManager[Any]],
) -> torch.Tensor:
    """This rank's shards of ``step``, one forward and backward each, their gradients left as
    the exact mean over every shard of the step; returns the mean of this rank's losses."""
    if len(batches) != reducer.per_rank:
        raise ValueError(f"{len(batches)} shards for a rank that holds {reducer.per_rank}")
    total: torch.Tensor | None = None
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        reduced = last and reducer.world > 1  # DDP's hook completes the sums
        with reducer.seeded(seed, step, i), micro_batch(reduced):
            loss = loss_of(batch, last)
            loss.backward()  # type: ignore[no-untyped-call]
        if not reduced:
            reducer.keep()
        total = loss.detach() if total is None else total + loss.detach()
    if reducer.world == 1:
        reducer.finish_alone()
    assert total is not None
    return total / len(batches)
