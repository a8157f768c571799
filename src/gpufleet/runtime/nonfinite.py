"""The NaN/Inf policy of the Trainer (spec.onNonFinite): notice a non-finite loss without a host
sync on healthy steps, agree on it across ranks before anything is saved or reported, and
either fail (``fail``, the default) or roll back and skip the bad batch (``rollback``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from gpufleet.errors import NonFiniteError
from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef
from gpufleet.runtime.context import MAX_ROLLBACKS
from gpufleet.runtime.distributed import control_group


class NonFinitePolicy:
    """What a Trainer does about NaN/Inf losses and weights; one per rank, collective checks.

    ``on_non_finite``: ``fail`` raises NonFiniteError; ``rollback`` lets the Trainer reload the
    newest checkpoint and skip the bad step's batch, at most ``max_rollbacks`` times.
    """

    def __init__(
        self,
        *,
        on_non_finite: str,
        device: torch.device,
        world_size: int,
        max_rollbacks: int = MAX_ROLLBACKS,
    ) -> None:
        self.on_non_finite = on_non_finite
        self.world_size = world_size
        self.max_rollbacks = max_rollbacks
        # The first step whose loss was NaN/Inf on this rank (0: none), kept on the device and
        # read only at log and checkpoint steps, so healthy steps add no host sync.
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)
        # rollback: steps whose batch is skipped, and rollbacks so far.
        self.skip: set[int] = set()
        self.rollbacks = 0

    def record(self, step: int, loss: torch.Tensor) -> None:
        """Note ``step`` as the first bad one when ``loss`` is not finite (on the device)."""
        bad = ~torch.isfinite(loss) & (self.first_bad == 0)
        self.first_bad = torch.where(bad, step, self.first_bad)

    def skips(self, step: int) -> bool:
        """Whether the batch of ``step`` is skipped (it made the loss non-finite before)."""
        return step in self.skip

    def check(
        self,
        step: int,
        *,
        params: Iterable[torch.Tensor] | None,
        last_checkpoint: str | None,
    ) -> None:
        """Raise NonFiniteError on every rank when any rank saw a NaN/Inf loss since the last
        check, or holds non-finite ``params`` (given when a checkpoint is next: a NaN gradient
        with a finite loss poisons the weights one step before the loss shows it). Collective."""
        first = int(self.first_bad.item())
        if params is not None and first == 0:
            # This rank's shards under FSDP: every rank checks its own, the verdicts are shared.
            local = list(params)
            if local and not torch.isfinite(torch.nn.utils.get_total_norm(local)):
                first = step
        seen = [first]
        if dist.is_initialized():
            gathered = [torch.zeros(1, dtype=torch.long) for _ in range(self.world_size)]
            dist.all_gather(gathered, torch.tensor([first]), group=control_group())
            seen = [int(t.item()) for t in gathered]
        bad = {rank: at for rank, at in enumerate(seen) if at}
        if not bad:
            return
        at = min(bad.values())
        ranks = ", ".join(str(r) for r, s in bad.items() if s == at)
        last = f"the last good checkpoint, {last_checkpoint}, is kept" if last_checkpoint else (
            "no checkpoint was written")  # fmt: skip
        raise NonFiniteError(
            f"the loss or weights became NaN or infinite at step {at} on rank {ranks} (checked "
            f"at step {step}); stopped before checkpointing it, {last}; lower the learning rate, "
            "check the data, or set spec.onNonFinite: rollback to skip bad batches",
            step=at,
        )

    def allow_rollback(self, exc: NonFiniteError) -> int:
        """The bad step to roll back over; re-raises ``exc`` when the policy is not rollback,
        and raises after ``max_rollbacks`` (a NaN no skipped batch cures)."""
        if self.on_non_finite != "rollback" or exc.step is None:
            raise exc
        if self.rollbacks >= self.max_rollbacks:
            raise NonFiniteError(
                f"{exc} (spec.onNonFinite rollback gave up: rolled back {self.rollbacks} "
                f"times already, skipping the batches of steps "
                f"{', '.join(map(str, sorted(self.skip)))})",
                step=exc.step,
            ) from None
        return exc.step

    def rolled_back(self, bad_step: int) -> None:
        """Record a rollback over ``bad_step``: its batch is skipped from now on."""
        self.first_bad.zero_()
        self.skip.add(bad_step)
        self.rollbacks += 1

    def roll_back(
        self,
        exc: NonFiniteError,
        checkpointer: Checkpointer,
        load: Callable[[CheckpointRef], object],
        log: Callable[[str], None],
    ) -> CheckpointRef:
        """spec.onNonFinite rollback: every rank (they all saw the same verdict) ``load``s the
        newest checkpoint, which holds only finite state (each save is checked first), and
        marks the bad step's batch to be skipped: the replay is deterministic, so it would
        meet the same batch again. Returns the checkpoint rolled back to and ``log``s it.
        Re-raises ``exc`` when not asked to, when there is nothing to roll back to, or after
        ``max_rollbacks`` (a NaN no skipped batch cures)."""
        bad_step = self.allow_rollback(exc)
        checkpointer.wait()  # an async save in flight is finite: checked before it began
        ref = checkpointer.latest()
        if ref is None:
            raise NonFiniteError(f"{exc} (spec.onNonFinite rollback: no checkpoint to roll back "
                                 "to)", step=exc.step) from None  # fmt: skip
        load(ref)
        self.rolled_back(bad_step)
        log(
            f"gpufleet: WARNING the loss or weights became NaN or infinite at step {bad_step}; "
            f"rolled back to step {ref.step} ({ref.path}), skipping the batch of step "
            f"{bad_step} (rollback {self.rollbacks} of at most {self.max_rollbacks})"
        )
        return ref
