"""The built-in digits workload under Ray Train: each Ray Train worker's loop (``train_loop``).

The PyTorch recipe of every digits run (digits_recipe: the CNN, SGD with momentum, cosine
decay) wrapped in DDP by Ray (``ray.train.torch.prepare_model``, over the process group Ray
Train sets up). What "exact" means, as for TensorFlow: the global batch of step ``s`` is a
pure function of the seed and ``s`` (digits_data.batch_indices), dropout draws from a generator
seeded by (seed, step, rank) before each step, and the model's, optimizer's and schedule's
state is in the checkpoint; so a run whose worker is killed, which Ray restarts from the last
checkpoint, ends with the uninterrupted run's weights, bit for bit, on the same number of
workers.

Checkpoints: worker 0 writes ``state.pt`` into a temporary directory and reports it to Ray
(``ray.train.report``), which copies it into the job's checkpoint directory under its step
directory's name; worker 0 then writes gpufleet's marker there (stepdirs: SHA-256 of every file,
the job's identity) and keeps ``spec.checkpoint.keep`` of them. On (re)start, worker 0 picks the
newest usable one (a corrupt one set aside, another job's refused) and names it to the others.
An error no restart can fix (no usable checkpoint, another job's, a NaN loss) is met by every
worker, which return (Ray would otherwise restart the group for it up to maxRestarts times);
worker 0 records it in the checkpoint directory, where the driver reads it and exits with its
code (a pod's run directory is its own)."""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet import errors
from gpufleet.errors import CheckpointError, GpufleetError, NonFiniteError
from gpufleet.frameworks.stepdirs import StepCheckpoints
from gpufleet.runtime.context import JobContext
from gpufleet.runtime.files import write_json_atomic
from gpufleet.runtime.rundir import RunDir
from gpufleet.spec import DigitsWorkload
from gpufleet.workloads.digits_data import batch_indices, digits_split

STATE = "state.pt"  # the torch.save'd state in a step directory
STARTS = "ray-starts"  # worker 0 appends a line per start of the loop: restarts are the rest
# Worker 0's record of an error no restart fixes, in the checkpoint directory: the storage every
# worker and the driver share (a pod's run directory is its own).
FATAL_RECORD = "gpufleet-fatal.json"


class RayCheckpoints(StepCheckpoints):
    """A Ray job's step directories (torch.save'd state; Ray copies them into place)."""

    framework = "Ray"
    format = "torch.save"


def log(message: str) -> None:
    print(message, flush=True)


def weights_digest(model: Any) -> str:
    """sha256 over every parameter's and buffer's name, dtype, shape and bytes, in order."""
    return state_digest(model.state_dict())


def state_digest(state: dict[str, Any]) -> str:
    """weights_digest of a model's ``state_dict`` (as a checkpoint's ``model`` holds it)."""
    h = hashlib.sha256()
    for name, tensor in state.items():
        value = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        h.update(value.numpy().tobytes())
    return h.hexdigest()


def model_fingerprint(model: Any) -> str:
    """16 hex digits over every tensor's name, shape and dtype (another model's is refused)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}\n".encode())
    return h.hexdigest()[:16]


class DigitsWorker:
    """One Ray Train worker's share of the digits training."""

    def __init__(self, context: JobContext) -> None:
        import ray.train
        import ray.train.torch

        from gpufleet.workloads.digits import digits_recipe

        self.context = context
        self.w = DigitsWorkload.model_validate(context.workload)
        train_context = ray.train.get_context()
        self.rank, self.world = train_context.get_world_rank(), train_context.get_world_size()
        self.chief = self.rank == 0
        self.global_batch = self.w.batch_size * self.world
        self.images, self.labels, self.train_idx, self.test_idx = digits_split(self.w.seed)
        recipe = digits_recipe(lr=self.w.lr, steps=self.w.steps, seed=self.w.seed)
        self.module, self.optimizer = recipe.model, recipe.optimizer
        self.scheduler = recipe.scheduler
        self.model = ray.train.torch.prepare_model(self.module)
        identity = {"job": context.name, "workload": "digits-ray",
                    "model": model_fingerprint(self.module)}  # fmt: skip
        self.store = RayCheckpoints(
            context.checkpoint.root(context.run_dir),
            every_steps=context.checkpoint.every_steps,
            keep=context.checkpoint.keep,
            identity=identity,
            chief=self.chief,
            log=log,
        )
        self.files = RunDir(context.run_dir)

    def _from_chief(self, value: Any) -> Any:
        import torch.distributed as dist

        box = [value if self.chief else None]
        if dist.is_available() and dist.is_initialized() and self.world > 1:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def restore(self) -> int | None:
        """Load the newest usable checkpoint worker 0 names; the step, or None when fresh.
        Worker 0's verdict against resuming is raised on every worker (its class and text)."""
        import torch

        verdict: tuple[str | None, str, str] = (None, "", "")
        if self.chief:
            try:
                found = self.store.newest_usable(self.world)
                verdict = (found.name if found else None, "", "")
            except GpufleetError as exc:
                verdict = (None, type(exc).__name__, str(exc))
        name, kind, message = self._from_chief(verdict)
        if kind:
            error: type[GpufleetError] = getattr(errors, kind, CheckpointError)
            raise error(message)
        if name is None:
            return None
        state = torch.load(self.store.root / name / STATE, weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        return int(state["step"])

    def save(self, step: int, metrics: dict[str, float]) -> str | None:
        """Report ``step`` to Ray (a barrier: every worker reports), with worker 0's checkpoint;
        the step directory's path (worker 0) or None."""
        import ray.train
        import torch

        if not self.chief:
            ray.train.report(metrics)
            return None
        scratch = Path(tempfile.mkdtemp(prefix="gpufleet-ray-ckpt-"))
        started = time.perf_counter()
        name = self.store.new_name(step)
        try:
            state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "step": step}  # fmt: skip
            torch.save(state, scratch / STATE)
            checkpoint = ray.train.Checkpoint.from_directory(str(scratch))
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # Marked once Ray's copy is in place (it copies files in parallel): a copy cut short
        # stays torn, never loaded.
        path = self.store.root / name
        self.store.mark(path, step, world_size=self.world, seconds=time.perf_counter() - started)
        self.store.purge(step)  # gpufleet's keeping, not Ray's: see driver.main
        log(f"gpufleet: checkpoint step {step} -> {path}")
        return str(path)

    def step(self, step: int) -> float:
        """One optimizer step on this worker's share of global batch ``step``; the global
        mean loss (all-reduced: a NaN on any worker stops every one)."""
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        idx = batch_indices(self.train_idx, self.w.seed, step, self.global_batch)
        mine = idx[self.rank * self.w.batch_size : (self.rank + 1) * self.w.batch_size]
        x = torch.from_numpy(self.images[mine]).unsqueeze(1)
        y = torch.from_numpy(self.labels[mine])
        torch.manual_seed((self.w.seed * 1_000_003 + step) * 4099 + self.rank)  # dropout
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.scheduler.step()
        mean = loss.detach().clone()
        if dist.is_initialized() and self.world > 1:
            dist.all_reduce(mean)
            mean /= self.world
        return float(mean)

    def fit(self) -> dict[str, Any]:
        """Train to the workload's step count; the result (worker 0's is written)."""
        resumed = self.restore()
        step = resumed or 0
        if resumed is not None and self.chief:
            log(f"gpufleet: resumed from step {resumed}")
        loss, last, seconds, started = math.nan, None, 0.0, time.perf_counter()
        first = step
        while step < self.w.steps:
            t0 = time.perf_counter()
            loss, step = self.step(step), step + 1
            seconds += time.perf_counter() - t0
            if not math.isfinite(loss):
                raise NonFiniteError(f"loss is {loss} at step {step}: stopped before saving it")
            if self.store.should_save(step, final=step == self.w.steps):
                last = self.save(step, {"step": step, "loss": loss}) or last
            if self.chief and (step % self.w.log_every == 0 or step == self.w.steps):
                rate = (step - first) * self.global_batch / seconds if seconds else 0.0
                log(f"step {step}/{self.w.steps} loss {loss:.4f} {rate:,.0f} samples/s")
        rate = (step - first) * self.global_batch / seconds if seconds else 0.0
        return {
            "steps": step, "final_loss": loss, "state_digest": weights_digest(self.module),
            "checkpoint": last, "resumed_from": resumed, "samples_per_second": rate,
            "metrics": {"accuracy": self.accuracy()}, "preempted": False,
            "wall_seconds": time.perf_counter() - started,
        }  # fmt: skip

    def accuracy(self) -> float:
        import torch

        from gpufleet.workloads.digits import accuracy

        x = torch.from_numpy(self.images[self.test_idx]).unsqueeze(1)
        test = torch.utils.data.TensorDataset(x, torch.from_numpy(self.labels[self.test_idx]))
        return accuracy(self.module, test)


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: ``config["env"]`` is the job's GPUFLEET_*
    environment (the driver's), which Ray's worker processes do not inherit."""
    context = JobContext.from_env(config["env"])
    files = RunDir(context.run_dir)
    worker = DigitsWorker(context)
    if worker.chief:
        with (Path(context.run_dir) / STARTS).open("a") as record:
            record.write(f"{time.time()}\n")
    try:
        result = worker.fit()
    except GpufleetError as exc:
        # No restart fixes it: every worker met it (worker 0's verdict, an all-reduced loss)
        # and returns, which ends the run without Ray retrying; the driver tells.
        if not exc.fatal:
            raise
        if worker.chief:
            fatal = {"exit_code": exc.exit_code, "message": str(exc)}
            write_json_atomic(worker.store.root / FATAL_RECORD, fatal)
        return
    if worker.chief:
        starts = (Path(context.run_dir) / STARTS).read_text().splitlines()
        result["restart_count"] = len(starts) - 1
        write_json_atomic(files.result, result)
        log(f"gpufleet: {result['steps']} steps; state digest {result['state_digest']}")
