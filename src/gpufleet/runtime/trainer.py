"""A training loop for users who don't want to write one: DDP or FSDP2 (gpufleet.runtime.parallel),
checkpoints, exact resume (also at another world size), preemption and the hang watchdog, wired
together. The loop is here; the parts it hands off live beside it: the save cadence in the
Checkpointer (``should_save``), the NaN/Inf policy in ``nonfinite``, progress and result
reporting in ``reporting``, what a checkpoint holds and how a resume at another world size
cuts the data in ``resume``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from gpufleet.errors import EXIT_PREEMPTED, NonFiniteError
from gpufleet.runtime import faults
from gpufleet.runtime.checkpoint import Checkpointer, CheckpointRef, model_fingerprint
from gpufleet.runtime.context import JobContext, ParallelismSettings, restart_count
from gpufleet.runtime.data import to_device
from gpufleet.runtime.distributed import DistInfo, control_group, init_distributed
from gpufleet.runtime.metrics import JobMetrics
from gpufleet.runtime.nonfinite import NonFinitePolicy
from gpufleet.runtime.parallel import full_state_digest, local_tensor, make_parallel, state_bytes
from gpufleet.runtime.preemption import PreemptionGuard
from gpufleet.runtime.reporting import Reporter, TrainResult, throughput
from gpufleet.runtime.resume import JobState, Progress, global_batch_loader, resized_note
from gpufleet.runtime.rng import seed_everything
from gpufleet.runtime.samplelog import SampleLog, open_for_rank
from gpufleet.runtime.watchdog import HangWatchdog

_JobState = JobState  # the names older code imports from here

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


class Trainer:
    """Trains ``model`` on ``data`` with DDP or FSDP2 and survives crashes, preemption and hangs.

    Resume is exact: model, optimizer, scheduler, data position and every rank's RNG state are
    checkpointed, so a run interrupted anywhere ends with the same weights, bit for bit, as an
    uninterrupted one. Exactness needs deterministic data (``num_workers=0`` loaders here).

    A resume at another world size keeps the checkpoint's global batch and its position in
    global samples (gpufleet.runtime.resume): none is skipped or seen twice. The weights match
    an uninterrupted run's up to reduction order, or bit for bit in exact mode
    (``exact_shards``, gpufleet.runtime.exact).

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
        self.progress = Progress(
            global_batch=config.batch_size * self.info.world_size,
            shards=self.settings.exact_shards,
        )
        self.nonfinite = NonFinitePolicy(
            on_non_finite=self.context.on_non_finite,
            device=self.info.device,
            world_size=self.info.world_size,
        )
        self._log = log or self._print
        self._use_global_batch(None)
        self.checkpointer = self._checkpointer(type(model).__name__, fingerprint)
        self.guard = PreemptionGuard(control_group())
        self.metrics = JobMetrics.from_env(
            self.context.name, self.info.rank, self.context.hang_timeout, config.steps
        )
        hang = getattr(self.metrics, "record_hang", None)  # a hang, in the job's metrics
        self.watchdog = HangWatchdog(self.context.hang_timeout, rank=self.info.rank, on_fire=hang)
        if self.metrics is not None:
            self.checkpointer.on_commit = self.metrics.record_checkpoint
        self.reporter = Reporter(info=self.info, steps=config.steps, log_every=config.log_every,
                                 run_dir=self.context.run_dir, log=self._log,
                                 metrics=self.metrics)  # fmt: skip
        self._samples: SampleLog | None = None
        self.after_step = after_step

    def _checkpointer(self, model_class: str, fingerprint: str) -> Checkpointer:
        """The job's Checkpointer (collective): its settings, the identity in its markers."""
        c, workload = self.context, self.context.workload.get("name")
        return Checkpointer(
            c.checkpoint_root,
            keep=c.checkpoint.keep,
            async_save=c.checkpoint.async_save,
            every_steps=c.checkpoint.every_steps,
            log=self._log,
            durable=c.checkpoint.durable,
            key_file=c.checkpoint.key_file,
            identity={
                "job": c.name,
                "workload": str(workload) if workload else model_class,
                "model": fingerprint,
            },
        )

    @property
    def steps_per_epoch(self) -> int:
        """Global batches in an epoch (the sampler's: it changes with the global batch)."""
        return self.sampler.steps_per_epoch

    @property
    def module(self) -> torch.nn.Module:
        """What the step function calls: the DDP wrapper, or the model (FSDP2 shards it in
        place)."""
        return self.parallel.module

    def _use_global_batch(self, ref: CheckpointRef | None) -> None:
        """Cut the data into steps of the global batch over this world size, in micro-batches
        (exact mode: this rank's shards)."""
        self.sampler, self.loader = global_batch_loader(
            self.data,
            global_batch=self.progress.global_batch,
            world=self.info.world_size,
            rank=self.info.rank,
            micro=self.settings.gradient_accumulation,
            shards=self.progress.shards,
            batch_size=self.config.batch_size,
            shuffle=self.config.shuffle,
            seed=self.config.seed,
            ref=ref,
        )
        if self.parallel.exact is not None:
            self.parallel.exact.use(self.progress.shards)

    def _print(self, msg: str) -> None:
        print(msg, file=sys.stderr if msg.startswith("gpufleet:") else sys.stdout, flush=True)

    def fit(self) -> TrainResult:
        """Train to ``config.steps`` (resuming from the newest complete checkpoint, if any).

        On SIGTERM/SIGINT: checkpoint at the next step boundary agreed by all ranks, write
        ``preempted.json`` and exit with EXIT_PREEMPTED.
        """
        seed_everything(self.config.seed + self.info.rank)
        state: dict[str, Any] = {"job": JobState(self)}
        ref = self.checkpointer.latest()
        if ref is not None:
            self._resume(ref, state)
        if self.context.sample_log is not None:  # every rank under rank 0's attempt id
            self._samples = open_for_rank(
                self.context.sample_log, self.info.rank, self.info.world_size
            )
        self.guard.install()
        self.watchdog.start()
        self._last_ckpt = ref.path if ref else None
        self._step_seconds: list[float] = []
        self._last_loss: torch.Tensor | None = None
        try:
            preempted = self._train(state)
            self.checkpointer.close()
            self.guard.drain()
        finally:  # on an error the process is about to die: no collectives here
            self.watchdog.stop()
            self.guard.uninstall()
            if self._samples is not None:
                self._samples.close()
        result = self._result(ref.step if ref else None)
        result.preempted = preempted
        if preempted:
            self._finish_preempted(result)
        return result

    def _train(self, state: dict[str, Any]) -> bool:
        """Steps until ``config.steps``, a preemption or ``after_step``'s True, epoch by
        epoch; returns whether all ranks agreed to stop for a preemption."""
        preempted = done = False
        mark = time.perf_counter()
        while self.progress.step < self.config.steps and not (preempted or done):
            p = self.progress
            if p.batch_in_epoch >= self.steps_per_epoch:  # a legacy or resized position
                p.epoch, p.batch_in_epoch = p.epoch + 1, 0
            self.sampler.set_position(p.epoch, p.batch_in_epoch)
            preempted, done, mark = self._epoch(state, mark)
        return preempted

    def _epoch(self, state: dict[str, Any], mark: float) -> tuple[bool, bool, float]:
        """Steps from the sampler's position to the end of its epoch, a stop, or a rollback
        (the sampler then starts again at the checkpoint's position). Returns (preempted,
        done, the time the next step's clock starts)."""
        micro, batches = self.sampler.rank_batch // self.sampler.micro, []  # per step
        for batch in self.loader:
            batches.append(batch)
            if len(batches) < micro:
                continue
            data_wait = time.perf_counter() - mark
            self._log_samples()
            if self.nonfinite.skips(self.progress.step + 1):
                self._log_main(f"gpufleet: skipping the batch of step {self.progress.step + 1}")
            else:
                self._last_loss = self._train_step(batches)
            batches = []
            self.progress.advance(self.steps_per_epoch)
            try:
                preempted = self._step_boundary(self._last_loss, state)
            except NonFiniteError as exc:
                self._roll_back(exc, state)  # raises unless spec.onNonFinite allows it
                self._last_loss = None  # the NaN is undone
                return False, False, time.perf_counter()
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
                return True, False, mark
            done = False
            if self.after_step is not None:
                done = self.after_step(self.progress.step)
                mark = time.perf_counter()  # the hook's time is no step's
            if done or self.progress.step >= self.config.steps or self.progress.batch_in_epoch == 0:
                return False, done, mark  # the last: epoch done, the sampler moves on
        return False, False, mark

    def _load(self, ref: CheckpointRef, state: dict[str, Any]) -> bool:
        """Load ``ref`` into ``state`` (a resume or a rollback); returns whether it was written
        at another world size. DCP reshards model and optimizer state; ranks the checkpoint has
        no RNG state for keep theirs; the data continue from the same global sample with the
        checkpoint's global batch."""
        job: JobState = state["job"]
        resized = ref.world_size not in (None, self.info.world_size)
        job.with_rng = not resized or self.info.rank < (ref.world_size or 0)
        keys = ("global_batch", "shards")  # those an older checkpoint lacks
        job.absent = [k for k in keys if not self.checkpointer.has_key(ref, f"job.progress.{k}")]
        try:
            self.checkpointer.load(ref, state)
        finally:
            job.with_rng, job.absent = True, []
        self.progress.settle(self.config.batch_size * (ref.world_size or self.info.world_size),
                             self.settings.exact_shards)  # fmt: skip
        self._use_global_batch(ref)
        return resized

    def _resume(self, ref: CheckpointRef, state: dict[str, Any]) -> None:
        """Load ``ref`` at the start of fit(), and say so (and how, after a resize)."""
        if self._load(ref, state):
            self._log_main(resized_note(ref, self.info.world_size, self.progress))
        self._log_main(f"gpufleet: resumed from step {ref.step} ({ref.path}, {ref.tier} tier)")
        if self.metrics is not None:
            self.metrics.record_resume(ref.step)

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
        saving = self.checkpointer.should_save(step, final=final, preempted=preempted)
        logging = self.reporter.due(step) and loss is not None
        if saving or logging:  # before anything is saved or reported
            # Weights too before a save: a NaN gradient with a finite loss poisons them one
            # step before the loss shows it. This rank's shards under FSDP.
            params = (local_tensor(p.detach()) for p in self.model.parameters())
            self.nonfinite.check(
                step, params=params if saving else None, last_checkpoint=self._last_ckpt
            )
        if logging:
            self.reporter.report(step, loss, self._step_seconds, self.progress.global_batch)
        if saving:
            self._last_ckpt = self.checkpointer.save(step, state, force_sync=preempted or final)
            self.watchdog.beat(step)
        return preempted

    def _train_step(self, batches: list[Any]) -> torch.Tensor:
        """One optimizer step over this rank's micro-batches (shards in exact mode); returns
        their mean loss."""
        self.parallel.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = self.parallel.gradients(
            batches, self._loss, seed=self.config.seed, step=self.progress.step + 1
        )
        self.nonfinite.record(self.progress.step + 1, total)
        # An async checkpoint may still be copying the weights and optimizer state: fence here,
        # so staging overlaps forward and backward but never sees a half-updated model.
        self.checkpointer.wait_staged()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return total

    def _loss(self, batch: Any, last: bool) -> torch.Tensor:
        """A micro-batch's loss; the ``nan@batch=N`` fault poisons a step's last."""
        with self.parallel.compute():
            loss = self.step_fn(self.parallel.module, to_device(batch, self.info.device))
        if last and faults.nan_fires("batch", self.progress.step + 1):
            loss = loss * float("nan")
        return loss

    def _poison(self) -> None:
        """The ``nan`` fault: a NaN in this rank's weights (tests of the non-finite check)."""
        with torch.no_grad():
            local_tensor(next(self.model.parameters())).fill_(float("nan"))

    def _roll_back(self, exc: NonFiniteError, state: dict[str, Any]) -> None:
        """spec.onNonFinite (NonFinitePolicy.roll_back): reload the newest checkpoint into
        ``state`` and skip the bad batch, or re-raise ``exc``."""
        ref = self.nonfinite.roll_back(
            exc, self.checkpointer, lambda ref: self._load(ref, state), self._log_main
        )
        self._last_ckpt = ref.path

    def _result(self, resumed_from: int | None) -> TrainResult:
        loss, seconds = self._last_loss, self._step_seconds
        held = {f"{k}_bytes": float(v) for k, v in state_bytes(self.model, self.optimizer).items()}
        exact = self.parallel.exact.costs(len(seconds)) if self.parallel.exact else {}
        return TrainResult(
            steps=self.progress.step,
            final_loss=self.reporter.mean(loss) if loss is not None else None,
            state_digest=full_state_digest(self.model, self.parallel.fsdp),
            checkpoint=self._last_ckpt,
            resumed_from=resumed_from,
            restart_count=restart_count(),
            samples_per_second=throughput(seconds, self.progress.global_batch),
            step_seconds=seconds,
            metrics={
                "global_batch": float(self.progress.global_batch),
                # This rank's share (rank 0 writes the result): 1/world of DDP's under FSDP.
                **held,
                **exact,
            },
        )

    def write_result(self, result: TrainResult) -> None:
        """Rank 0 writes ``result.json`` into the run directory for the launcher's summary."""
        self.reporter.write_result(result)

    def _finish_preempted(self, result: TrainResult) -> None:
        self.reporter.write_preempted(result, self.guard.signalled_at)
        from gpufleet.runtime.distributed import shutdown_distributed

        shutdown_distributed()
        raise SystemExit(EXIT_PREEMPTED)
