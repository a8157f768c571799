"""What a Trainer tells the world: the step log line and ``progress.json`` at each report, the
loss gauge of the job metrics, ``result.json`` at the end and ``preempted.json`` after a
preemption checkpoint (file names: gpufleet.runtime.rundir)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpufleet.runtime.context import restart_count
from gpufleet.runtime.distributed import DistInfo
from gpufleet.runtime.files import write_json_atomic
from gpufleet.runtime.metrics import JobMetrics
from gpufleet.runtime.rundir import RunDir


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


def throughput(seconds: list[float], global_batch: int) -> float:
    """Samples per second over steps that took ``seconds`` each (0 when none took time)."""
    total = sum(seconds)
    samples = len(seconds) * global_batch
    return samples / total if total > 0 else 0.0


class Reporter:
    """Reports a Trainer's progress and result. ``mean`` and ``report`` are collective (every
    rank calls them); rank 0 logs and writes the run directory's files."""

    def __init__(
        self,
        *,
        info: DistInfo,
        steps: int,
        log_every: int,
        run_dir: Path,
        log: Callable[[str], None],
        metrics: JobMetrics | None = None,
    ) -> None:
        self.info = info
        self.steps = steps
        self.log_every = log_every
        self.files = RunDir(run_dir)
        self.log = log
        self.metrics = metrics

    def due(self, step: int) -> bool:
        """Whether ``step`` gets a report: every ``log_every`` steps, and the last one."""
        return step % self.log_every == 0 or step >= self.steps

    def log_main(self, msg: str) -> None:
        """Log ``msg`` once, from rank 0."""
        if self.info.is_main:
            self.log(msg)

    def mean(self, value: torch.Tensor) -> float:
        """``value`` averaged over all ranks (collective)."""
        value = value.detach().float().clone()
        if dist.is_initialized():
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.info.world_size
        return float(value.item())

    def report(
        self, step: int, loss: torch.Tensor | None, seconds: list[float], global_batch: int
    ) -> None:
        """The mean loss and the rate of the last ``log_every`` steps: a log line, the loss
        gauge and ``progress.json`` (collective: the loss is averaged over ranks)."""
        mean_loss = self.mean(loss) if loss is not None else float("nan")
        recent = seconds[-self.log_every :]
        sps = throughput(recent, global_batch)
        if self.metrics is not None and self.info.is_main:
            self.metrics.loss.set(mean_loss)
        if self.info.is_main:
            self.log(f"step {step}/{self.steps} loss {mean_loss:.4f} {sps:,.0f} samples/s")
            write_json_atomic(
                self.files.progress,
                {
                    "step": step,
                    "steps": self.steps,
                    "loss": mean_loss,
                    "samples_per_second": sps,
                    # `gpufleet jobs` reckons the time to go from it (gpufleet.launch.runs)
                    "step_seconds": sum(recent) / len(recent) if recent else None,
                    "restart_count": restart_count(),
                    "time": time.time(),
                },
            )

    def write_result(self, result: TrainResult) -> None:
        """Rank 0 writes ``result.json`` for the launcher's summary, and logs the state digest
        (in a pod the run directory goes with it; `gpufleet logs` keeps the line)."""
        if self.info.is_main:
            write_json_atomic(self.files.result, result.to_json())
            self.log(f"gpufleet: {result.steps} steps; state digest {result.state_digest}")

    def write_preempted(self, result: TrainResult, signalled_at: float | None = None) -> None:
        """After a preemption checkpoint: ``result.json`` (rank 0) and every node's
        ``preempted.json`` (its first worker; in a pod, the pod's own run directory), so each
        node's launcher reports "preempted" rather than "killed by SIGTERM"."""
        self.write_result(result)
        if self.info.local_rank == 0:
            mark = {"step": result.steps, "checkpoint": result.checkpoint}
            write_json_atomic(self.files.preempted, {**mark, "signalled_at": signalled_at})
        self.log_main(f"gpufleet: preempted at step {result.steps}; checkpoint {result.checkpoint}")
