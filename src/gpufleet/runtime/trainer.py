"""A training loop for users who don't want to write one: DDP or FSDP2 (gpufleet.runtime.parallel),
checkpoints, exact resume (also at another world size), preemption and the hang watchdog, wired
together."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import DataLoader, Dataset

from gpufleet.errors import EXIT_PREEMPTED, JobConfigError, NonFiniteError, ReshardError
from gpufleet.runtime import faults
from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef, model_fingerprint
from gpufleet.runtime.context import MAX_ROLLBACKS, PREEMPTED_FILE, JobContext, ParallelismSettings
from gpufleet.runtime.data import GlobalBatchSampler
from gpufleet.runtime.distributed import DistInfo, control_group, init_distributed
from gpufleet.runtime.files import write_json_atomic
from gpufleet.runtime.metrics import JobMetrics
from gpufleet.runtime.parallel import full_state_digest, local_tensor, make_parallel, state_bytes
from gpufleet.runtime.preemption import PreemptionGuard
from gpufleet.runtime.rng import capture_rng, restore_rng, seed_everything
from gpufleet.runtime.samplelog import SampleLog, attempt_id
from gpufleet.runtime.watchdog import HangWatchdog

StepFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def cross_entropy_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Default step: ``batch`` is ``(inputs, targets)``; returns the cross-entropy loss."""
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(model(inputs), targets)


@dataclass(kw_only=True)
class TrainerConfig:
    """How long to train and how to log; checkpoint and watchdog settings come from the job."""

    steps: int
    batch_size: int
    seed: int = 0
    log_every: int = 25
    shuffle: bool = True


@dataclass(kw_only=True)
class TrainResult:
    """What a finished (or preempted) run reports. Written to <run dir>/result.json by rank 0."""

    steps: int
    final_loss: float | None
    state_digest: str
    checkpoint: str | None
    resumed_from: int | None
    restart_count: int
    samples_per_second: float
    preempted: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The JSON-able summary (without per-step timings)."""
        out = dict(self.__dict__)
        out.pop("step_seconds")
        return out


@dataclass
class _Progress:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # steps (global batches) done in this epoch
    global_batch: int = 0  # samples per step over all ranks, fixed by the first run


class _JobState(Stateful):
    """Everything exact resume needs, as one DCP Stateful: DCP calls these on save and load."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        # False when resuming at a world size the checkpoint has no RNG state for this rank.
        self.with_rng = True
        # False for a checkpoint written before progress had a global batch.
        self.with_global_batch = True

    def state_dict(self) -> dict[str, Any]:
        t = self.t
        model_sd, optim_sd = get_state_dict(t.model, t.optimizer)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": t.scheduler.state_dict() if t.scheduler else {},
            "progress": dict(t.progress.__dict__),
        }
        if not self.with_global_batch:
            del state["progress"]["global_batch"]
        if self.with_rng:
            # Each rank's generators differ (seeded by rank), so each rank keeps its own key;
            # a shared key would be deduplicated by DCP and saved by one rank only.
            state[f"rng_rank{t.info.rank}"] = capture_rng()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        t = self.t
        set_state_dict(
            t.model,
            t.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if t.scheduler is not None:
            t.scheduler.load_state_dict(state_dict["scheduler"])
        t.progress = _Progress(**{"global_batch": 0, **state_dict["progress"]})
        if self.with_rng:
            restore_rng(state_dict[f"rng_rank{t.info.rank}"])


class Trainer:
    """Trains ``model`` on ``data`` with DDP or FSDP2 and survives crashes, preemption and hangs.

    Resume is exact: model, optimizer, scheduler, data position and every rank's RNG state are
    checkpointed, so a run interrupted anywhere ends with the same weights, bit for bit, as an
    uninterrupted one. Exactness needs deterministic data (``num_workers=0`` loaders here).

    A resume at another world size keeps the checkpoint's global batch (``batch_size`` times
    the world size of the first run) and its position in global samples: DCP reshards model
    and optimizer state, every step trains on the same samples as before, none is skipped or
    seen twice. The weights then match an uninterrupted run only up to floating-point
    reduction order (and per-rank RNG draws, such as dropout, differ): close, not bit-exact.

    ``parallelism`` defaults to the job's (spec.parallelism); ``blocks`` are the modules FSDP
    shards and activation checkpointing recomputes one by one (default:
    gpufleet.runtime.parallel.default_blocks).

    ``after_step(step)``, when given, runs on every rank after each step (after its checkpoint
    and log line); returning True ends training there, as reaching ``config.steps`` does. Every
    rank must return the same: an evaluation every rank runs, such as a target accuracy
    reached (gpufleet.bench.training). Its time is not counted in step times.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: Dataset[Any],
        optimizer: torch.optim.Optimizer,
        *,
        config: TrainerConfig,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        step_fn: StepFn = cross_entropy_step,
        context: JobContext | None = None,
        log: Callable[[str], None] | None = None,
        parallelism: ParallelismSettings | None = None,
        blocks: list[torch.nn.Module] | None = None,
        after_step: Callable[[int], bool] | None = None,
    ) -> None:
        self.config = config
        self.context = context or JobContext.from_env()
        self.settings = parallelism or self.context.parallelism
        self.info: DistInfo = init_distributed()
        self.data = data
        fingerprint = model_fingerprint(model)  # before any wrapping: plain parameter names
        self.model = model.to(self.info.device)
        self.optimizer = optimizer
        self.parallel = make_parallel(self.model, optimizer, self.settings, self.info, blocks)
        self.scheduler = scheduler
        self.step_fn = step_fn
        self.progress = _Progress(global_batch=config.batch_size * self.info.world_size)
        # The first step whose loss was NaN/Inf on this rank (0: none), kept on the device and
        # read only at log and checkpoint steps, so healthy steps add no host sync.
        self._first_bad = torch.zeros((), dtype=torch.long, device=self.info.device)
        # spec.onNonFinite rollback: steps whose batch is skipped, and rollbacks so far.
        self._skip: set[int] = set()
        self._rollbacks = 0
        self._log = log or self._print
        self._use_global_batch(self.progress.global_batch, None)
        workload = self.context.workload.get("name")
        self.checkpointer = Checkpointer(
            self.context.checkpoint_root,
            keep=self.context.checkpoint.keep,
            async_save=self.context.checkpoint.async_save,
            log=self._log,
            identity={
                "job": self.context.name,
                "workload": str(workload) if workload else type(model).__name__,
                "model": fingerprint,
            },
        )
        self.guard = PreemptionGuard(control_group())
        self.watchdog = HangWatchdog(self.context.hang_timeout, rank=self.info.rank)
        self.metrics = JobMetrics.from_env(
            self.context.name, self.info.rank, self.context.hang_timeout
        )
        if self.metrics is not None:
            self.checkpointer.on_commit = self.metrics.record_checkpoint
        self._samples: SampleLog | None = None
        self.after_step = after_step

    @property
    def steps_per_epoch(self) -> int:
        """Global batches in an epoch (the sampler's: it changes with the global batch)."""
        return self.sampler.steps_per_epoch

    @property
    def module(self) -> torch.nn.Module:
        """What the step function calls: the DDP wrapper, or the model (FSDP2 shards it in
        place)."""
        return self.parallel.module

    def _use_global_batch(self, global_batch: int, ref: CheckpointRef | None) -> None:
        """Cut the data into steps of ``global_batch`` samples over this world size."""
        world, micro = self.info.world_size, self.settings.gradient_accumulation
        if global_batch % (world * micro):
            raise ReshardError(_unsplittable(global_batch, world, micro, ref))
        self.sampler = GlobalBatchSampler(
            len(self.data),  # type: ignore[arg-type]  # a map-style data set
            global_batch=global_batch,
            num_replicas=world,
            rank=self.info.rank,
            micro_batches=micro,
            shuffle=self.config.shuffle,
            seed=self.config.seed,
        )
        self.loader = DataLoader(
            self.data,
            batch_sampler=self.sampler,
            num_workers=0,
            # A private generator: creating a loader iterator draws a seed from it, and that
            # draw must not move the global RNG a resumed run restores.
            generator=torch.Generator().manual_seed(self.config.seed),
        )
        if self.steps_per_epoch == 0:
            raise JobConfigError(
                f"a global batch of {global_batch} ({self.config.batch_size} per worker) is "
                f"larger than the data ({len(self.data)} samples)"  # type: ignore[arg-type]
            )

    def _print(self, msg: str) -> None:
        print(msg, file=sys.stderr if msg.startswith("gpufleet:") else sys.stdout, flush=True)

    def fit(self) -> TrainResult:
        """Train to ``config.steps`` (resuming from the newest complete checkpoint, if any).

        On SIGTERM/SIGINT: checkpoint at the next step boundary agreed by all ranks, write
        ``preempted.json`` and exit with EXIT_PREEMPTED.
        """
        cfg = self.config
        seed_everything(cfg.seed + self.info.rank)
        job = _JobState(self)
        state = {"job": job}
        ref = self.checkpointer.latest()
        if ref is not None:
            self._resume(ref, state)
        self._open_sample_log()
        self.guard.install()
        self.watchdog.start()
        self._last_ckpt = ref.path if ref else None
        self._step_seconds: list[float] = []
        last_loss: torch.Tensor | None = None
        preempted = done = False
        micro = self.settings.gradient_accumulation
        try:
            mark = time.perf_counter()
            while self.progress.step < cfg.steps and not (preempted or done):
                p = self.progress
                if p.batch_in_epoch >= self.steps_per_epoch:  # a legacy or resized position
                    p.epoch, p.batch_in_epoch = p.epoch + 1, 0
                self.sampler.set_position(p.epoch, p.batch_in_epoch)
                batches: list[Any] = []
                for batch in self.loader:
                    batches.append(batch)
                    if len(batches) < micro:
                        continue
                    data_wait = time.perf_counter() - mark
                    self._log_samples()
                    if self.progress.step + 1 in self._skip:
                        step = self.progress.step + 1
                        self._log_main(f"gpufleet: skipping the batch of step {step}")
                    else:
                        last_loss = self._train_step(batches)
                    batches = []
                    self._advance()
                    try:
                        preempted = self._step_boundary(last_loss, state)
                    except NonFiniteError as exc:
                        self._roll_back(exc, state)  # raises unless spec.onNonFinite allows it
                        last_loss, mark = None, time.perf_counter()  # the NaN is undone
                        break  # the sampler starts again at the checkpoint's position
                    # A step's time is boundary to boundary: data, compute and any checkpoint
                    # blocking, so overheads show up in step times.
                    now = time.perf_counter()
                    self._step_seconds.append(now - mark)
                    if self.metrics is not None:
                        self.metrics.record_step(
                            self.progress.step, now - mark, data_wait, self.sampler.rank_batch
                        )
                    mark = now
                    if preempted:
                        break
                    if self.after_step is not None:
                        done = self.after_step(self.progress.step)
                        mark = time.perf_counter()  # the hook's time is no step's
                    if done or self.progress.step >= cfg.steps:
                        break
                    if self.progress.batch_in_epoch == 0:
                        break  # epoch done: the sampler moves on
            self.checkpointer.close()
            self.guard.drain()
        finally:  # on an error the process is about to die: no collectives here
            self.watchdog.stop()
            self.guard.uninstall()
            if self._samples is not None:
                self._samples.close()
        step_seconds = self._step_seconds
        last_ckpt = self._last_ckpt
        result = self._result(last_loss, last_ckpt, ref.step if ref else None, step_seconds)
        result.preempted = preempted
        if preempted:
            self._finish_preempted(result)
        return result

    def _load(self, ref: CheckpointRef, state: dict[str, Any]) -> bool:
        """Load ``ref`` into ``state`` (a resume or a rollback); returns whether it was written
        at another world size. DCP reshards model and optimizer state; ranks the checkpoint has
        no RNG state for keep theirs; the data continue from the same global sample with the
        checkpoint's global batch."""
        job: _JobState = state["job"]
        resized = ref.world_size not in (None, self.info.world_size)
        job.with_rng = not resized or self.info.rank < (ref.world_size or 0)
        job.with_global_batch = self.checkpointer.has_key(ref, "job.progress.global_batch")
        try:
            self.checkpointer.load(ref, state)
        finally:
            job.with_rng = job.with_global_batch = True
        if not self.progress.global_batch:  # written before the global batch was kept
            self.progress.global_batch = self.config.batch_size * (
                ref.world_size or self.info.world_size
            )
        if self.progress.global_batch != self.sampler.global_batch:
            self._use_global_batch(self.progress.global_batch, ref)
        return resized

    def _resume(self, ref: CheckpointRef, state: dict[str, Any]) -> None:
        """Load ``ref`` at the start of fit(), and say so (and how, after a resize)."""
        if self._load(ref, state):
            per_worker = self.progress.global_batch // self.info.world_size
            self._log_main(
                f"gpufleet: checkpoint written by {ref.world_size} processes, resuming with "
                f"{self.info.world_size}: model and optimizer resharded; the global batch "
                f"stays {self.progress.global_batch} ({per_worker} per worker) and no sample "
                "is skipped or repeated; weights match an uninterrupted run up to reduction "
                "order, not bit for bit"
            )
        self._log_main(f"gpufleet: resumed from step {ref.step} ({ref.path})")

    def _open_sample_log(self) -> None:
        """GPUFLEET_SAMPLE_LOG: every rank of this attempt logs under rank 0's attempt id."""
        if self.context.sample_log is None:
            return
        box = [attempt_id() if self.info.is_main else 0]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0, group=control_group())
        self._samples = SampleLog(
            self.context.sample_log, box[0], self.info.rank, self.info.world_size
        )

    def _log_samples(self) -> None:
        ids = self.sampler.take()
        if self._samples is not None:
            self._samples.write(self.progress.step + 1, self.progress.epoch, ids)

    def _log_main(self, msg: str) -> None:
        if self.info.is_main:
            self._log(msg)

    def _step_boundary(self, loss: torch.Tensor | None, state: dict[str, Any]) -> bool:
        """Everything between two steps; returns True when all ranks agreed to stop."""
        step = self.progress.step
        self.watchdog.beat(step)
        faults.maybe_fire("step", step, poison=self._poison)
        self.checkpointer.poll()
        preempted = self.guard.should_stop()
        final = step >= self.config.steps
        saving = preempted or final or step % self.context.checkpoint.every_steps == 0
        logging = (step % self.config.log_every == 0 or final) and loss is not None
        if saving or logging:
            self._check_finite(step, weights=saving)  # before anything is saved or reported
        if logging:
            self._report(step, loss, self._step_seconds)
        if saving:
            self._last_ckpt = self.checkpointer.save(step, state, force_sync=preempted or final)
            self.watchdog.beat(step)
        return preempted

    def _train_step(self, batches: list[Any]) -> torch.Tensor:
        """One optimizer step over this rank's micro-batches; returns their mean loss."""
        module, micro = self.parallel.module, len(batches)
        module.train()
        self.optimizer.zero_grad(set_to_none=True)
        total: torch.Tensor | None = None
        for i, batch in enumerate(batches):
            with self.parallel.micro_batch(last=i == micro - 1):
                with self.parallel.compute():
                    loss = self.step_fn(module, _to_device(batch, self.info.device))
                if i == micro - 1 and self._bad_batch():
                    loss = loss * float("nan")  # the ``nan@batch=N`` fault
                # Mean over micro-batches, as one batch of their size would have it.
                (loss / micro if micro > 1 else loss).backward()  # type: ignore[no-untyped-call]
            part = loss.detach() / micro if micro > 1 else loss.detach()
            total = part if total is None else total + part
        assert total is not None  # at least one micro-batch per step
        bad = ~torch.isfinite(total) & (self._first_bad == 0)
        self._first_bad = torch.where(bad, self.progress.step + 1, self._first_bad)
        # An async checkpoint may still be copying the weights and optimizer state: fence here,
        # so staging overlaps forward and backward but never sees a half-updated model.
        self.checkpointer.wait_staged()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return total

    def _bad_batch(self) -> bool:
        """Whether the ``nan@batch=N`` fault makes this step's loss NaN."""
        fired: list[bool] = []
        faults.maybe_fire("batch", self.progress.step + 1, poison=lambda: fired.append(True))
        return bool(fired)

    def _poison(self) -> None:
        """The ``nan`` fault: a NaN in this rank's weights (tests of the non-finite check)."""
        with torch.no_grad():
            local_tensor(next(self.model.parameters())).fill_(float("nan"))

    def _check_finite(self, step: int, *, weights: bool) -> None:
        """Raise NonFiniteError on every rank when any rank saw a NaN/Inf loss since the last
        check, or (``weights``: a checkpoint is next) holds non-finite weights: a NaN gradient
        with a finite loss poisons the weights one step before the loss shows it."""
        first = int(self._first_bad.item())
        if weights and first == 0:
            # This rank's shards under FSDP: every rank checks its own, the verdicts are shared.
            params = [local_tensor(p.detach()) for p in self.model.parameters()]
            if params and not torch.isfinite(torch.nn.utils.get_total_norm(params)):
                first = step
        seen = [first]
        if dist.is_initialized():
            gathered = [torch.zeros(1, dtype=torch.long) for _ in range(self.info.world_size)]
            dist.all_gather(gathered, torch.tensor([first]), group=control_group())
            seen = [int(t.item()) for t in gathered]
        bad = {rank: at for rank, at in enumerate(seen) if at}
        if not bad:
            return
        at = min(bad.values())
        ranks = ", ".join(str(r) for r, s in bad.items() if s == at)
        last = f"the last good checkpoint, {self._last_ckpt}, is kept" if self._last_ckpt else (
            "no checkpoint was written")  # fmt: skip
        raise NonFiniteError(
            f"the loss or weights became NaN or infinite at step {at} on rank {ranks} (checked "
            f"at step {step}); stopped before checkpointing it, {last}; lower the learning rate, "
            "check the data, or set spec.onNonFinite: rollback to skip bad batches",
            step=at,
        )

    def _roll_back(self, exc: NonFiniteError, state: dict[str, Any]) -> None:
        """spec.onNonFinite rollback: every rank (they all saw the same verdict) reloads the
        newest checkpoint, which holds only finite state (each save is checked first), and
        marks the bad step's batch to be skipped: the replay is deterministic, so it would
        meet the same batch again. Re-raises ``exc`` when not asked to, when there is nothing
        to roll back to, or after MAX_ROLLBACKS (a NaN no skipped batch cures)."""
        if self.context.on_non_finite != "rollback" or exc.step is None:
            raise exc
        if self._rollbacks >= MAX_ROLLBACKS:
            raise NonFiniteError(
                f"{exc} (spec.onNonFinite rollback gave up: rolled back {self._rollbacks} "
                f"times already, skipping the batches of steps "
                f"{', '.join(map(str, sorted(self._skip)))})",
                step=exc.step,
            ) from None
        self.checkpointer.wait()  # an async save in flight is finite: checked before it began
        ref = self.checkpointer.latest()
        if ref is None:
            raise NonFiniteError(f"{exc} (spec.onNonFinite rollback: no checkpoint to roll back "
                                 "to)", step=exc.step) from None  # fmt: skip
        self._load(ref, state)
        self._first_bad.zero_()
        self._skip.add(exc.step)
        self._rollbacks += 1
        self._last_ckpt = ref.path
        self._log_main(
            f"gpufleet: WARNING the loss or weights became NaN or infinite at step {exc.step}; "
            f"rolled back to step {ref.step} ({ref.path}), skipping the batch of step "
            f"{exc.step} (rollback {self._rollbacks} of at most {MAX_ROLLBACKS})"
        )

    def _advance(self) -> None:
        p = self.progress
        p.step += 1
        p.batch_in_epoch += 1
        if p.batch_in_epoch == self.steps_per_epoch:
            p.epoch += 1
            p.batch_in_epoch = 0

    def _mean(self, value: torch.Tensor) -> float:
        value = value.detach().float().clone()
        if dist.is_initialized():
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.info.world_size
        return float(value.item())

    def _report(self, step: int, loss: torch.Tensor | None, seconds: list[float]) -> None:
        mean_loss = self._mean(loss) if loss is not None else float("nan")
        recent = seconds[-self.config.log_every :]
        sps = self._throughput(recent)
        if self.metrics is not None and self.info.is_main:
            self.metrics.loss.set(mean_loss)
        if self.info.is_main:
            self._log(f"step {step}/{self.config.steps} loss {mean_loss:.4f} {sps:,.0f} samples/s")
            write_json_atomic(
                self.context.run_dir / "progress.json",
                {
                    "step": step,
                    "steps": self.config.steps,
                    "loss": mean_loss,
                    "samples_per_second": sps,
                    "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                    "time": time.time(),
                },
            )

    def _throughput(self, seconds: list[float]) -> float:
        total = sum(seconds)
        samples = len(seconds) * self.progress.global_batch
        return samples / total if total > 0 else 0.0

    def _result(
        self,
        loss: torch.Tensor | None,
        checkpoint: str | None,
        resumed_from: int | None,
        seconds: list[float],
    ) -> TrainResult:
        return TrainResult(
            steps=self.progress.step,
            final_loss=self._mean(loss) if loss is not None else None,
            state_digest=full_state_digest(self.model, self.parallel.fsdp),
            checkpoint=checkpoint,
            resumed_from=resumed_from,
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            samples_per_second=self._throughput(seconds),
            step_seconds=seconds,
            metrics={
                "global_batch": float(self.progress.global_batch),
                # This rank's share (rank 0 writes the result): 1/world of DDP's under FSDP.
                **{f"{k}_bytes": float(v) for k, v in self._state_bytes().items()},
            },
        )

    def _state_bytes(self) -> dict[str, int]:
        return state_bytes(self.model, self.optimizer)

    def write_result(self, result: TrainResult) -> None:
        """Rank 0 writes ``result.json`` into the run directory for the launcher's summary."""
        if self.info.is_main:
            write_json_atomic(self.context.run_dir / "result.json", result.to_json())

    def _finish_preempted(self, result: TrainResult) -> None:
        self.write_result(result)
        # Every node's first worker marks its run directory (in a pod: the pod's own), so each
        # node's launcher can report "preempted" rather than "killed by SIGTERM".
        if self.info.local_rank == 0:
            write_json_atomic(
                self.context.run_dir / PREEMPTED_FILE,
                {"step": result.steps, "checkpoint": result.checkpoint},
            )
        self._log_main(
            f"gpufleet: preempted at step {result.steps}; checkpoint {result.checkpoint}"
        )
        from gpufleet.runtime.distributed import shutdown_distributed

        shutdown_distributed()
        raise SystemExit(EXIT_PREEMPTED)


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _unsplittable(global_batch: int, world: int, micro: int, ref: CheckpointRef | None) -> str:
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


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
