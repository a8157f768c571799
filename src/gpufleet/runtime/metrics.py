"""Job metrics from inside workers, for Prometheus (prometheus_client, multiprocess mode).

Choice: **aggregated, not per worker.** Each worker writes its series into the directory in
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode: memory-mapped files, no
server in the worker), and one server reads the whole directory. Locally that server is
``gpufleet run`` itself, so the job has one endpoint, on the spec's port, that stays up while
workers crash and restart (no scrape gaps, no port per rank to configure). Series carry a
``rank`` label where ranks differ (step time, data wait), counters are summed over a rank's
restarts, and gauges report the most recent writer (after a restart: the new process).

Without that variable (a plain torchrun run, unit tests) ``JobMetrics.from_env`` returns None
and the Trainer records nothing.
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

from gpufleet.runtime.context import ENV_METRICS_DIR

# The series `gpufleet status` reads back (gpufleet.cluster.progress), named once.
STEP = "gpufleet_job_step"
TOTAL_STEPS = "gpufleet_job_total_steps"
LAST_CHECKPOINT_STEP = "gpufleet_job_last_checkpoint_step"
SAMPLES = "gpufleet_job_samples"  # a Counter: exposed as SAMPLES + "_total"
RESTARTS = "gpufleet_job_restarts"
HANG_TIMEOUT = "gpufleet_job_hang_timeout_seconds"
WORLD_SIZE = "gpufleet_job_world_size"  # workers of the current attempt: it changes on a resize
LAST_PROGRESS = "gpufleet_job_last_progress_timestamp_seconds"
# Written only when it happens (a worker that never resumed or hung has no such series), by
# a process that then ends: a multiprocess "mostrecent" gauge outlives it, so the next
# attempt's workers and `gpufleet status` still see the last one.
RESUMED_FROM = "gpufleet_job_resumed_from_step"
HUNG_AT = "gpufleet_job_hung_at_step"
STEP_SECONDS = "gpufleet_job_step_duration_seconds"  # a Histogram: _sum, _count, _bucket
# The durable tier (spec.checkpoint.durable), from each node's uploader in its launcher
# (gpufleet.launch.uploads.DurableCollector), labelled job_name alone: one series per node.
DURABLE_STEP = "gpufleet_job_checkpoint_durable_step"
DURABLE_LAG_STEPS = "gpufleet_job_checkpoint_durable_lag_steps"
DURABLE_LAG_SECONDS = "gpufleet_job_checkpoint_durable_lag_seconds"
UPLOAD_FAILURES = "gpufleet_job_checkpoint_upload_failures"  # a Counter: exposed + "_total"

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
CKPT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class JobMetrics:
    """The series one worker writes; names are ``gpufleet_job_*`` with unit suffixes."""

    def __init__(
        self,
        job: str,
        rank: int,
        registry: Any = None,
        *,
        hang_timeout: float = 0.0,
        total_steps: int = 0,
    ) -> None:
        from prometheus_client import REGISTRY, Gauge

        reg = REGISTRY if registry is None else registry

        # Not "job": Prometheus sets that label to the scrape job's name and would rename ours.
        by_rank = ["job_name", "rank"]
        self._labels: dict[str, Any] = {"job_name": job, "rank": str(rank)}
        self.rank = rank
        l = self._labels  # noqa: E741

        def gauge(name: str, doc: str, mode: Literal["mostrecent", "max"] = "mostrecent") -> Any:
            return Gauge(name, doc, by_rank, multiprocess_mode=mode, registry=reg).labels(**l)

        self.step = gauge(STEP, "Last completed training step.")
        self.loss = gauge("gpufleet_job_loss", "Mean training loss over all ranks (last report).")
        self._gauge, self._lazy = gauge, dict[str, Any]()
        self.restarts = gauge(RESTARTS, "Worker-group restarts so far (this pod's agent).")
        self.last_progress = gauge(
            LAST_PROGRESS,
            "Unix time of the last completed step.",
            mode="max",
        )
        self._throughput(reg, by_rank)
        # The job's own patience (spec.hangTimeout): the no-progress alert compares against it.
        self.hang_timeout = gauge(HANG_TIMEOUT, "The job's hangTimeout (0: no watchdog).")
        self.hang_timeout.set(hang_timeout)
        # With the step and the last checkpoint, what `status` shows of a running job: how far
        # it is, and where a restart would resume.
        self.total_steps = gauge(TOTAL_STEPS, "Steps the job trains in all (0: not known).")
        self.total_steps.set(total_steps)
        self.last_checkpoint_step = gauge(
            LAST_CHECKPOINT_STEP, "Step of the last committed checkpoint.", "max"
        )
        self.restarts.set(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        self.world_size = gauge(WORLD_SIZE, "Workers of the job's current attempt (torchrun's).")
        self.world_size.set(int(os.environ.get("WORLD_SIZE", "1")))

    def _throughput(self, reg: Any, by_rank: list[str]) -> None:
        """The counters and histograms: steps, samples, data waits, step and checkpoint times."""
        from prometheus_client import Counter, Histogram

        l = self._labels  # noqa: E741
        self.steps = Counter(
            "gpufleet_job_steps", "Steps completed.", by_rank, registry=reg
        ).labels(**l)
        self.samples = Counter(SAMPLES, "Samples trained on.", by_rank, registry=reg).labels(**l)
        self.data_wait = Counter(
            "gpufleet_job_data_wait_seconds", "Time spent waiting for the next batch.", by_rank,
            registry=reg,
        ).labels(**l)  # fmt: skip
        self.step_seconds = Histogram(
            STEP_SECONDS, "Step time, boundary to boundary.", by_rank,
            buckets=STEP_BUCKETS, registry=reg,
        ).labels(**l)  # fmt: skip
        self.ckpt_blocking = Histogram(
            "gpufleet_job_checkpoint_blocking_seconds",
            "Time a checkpoint held up training (sync save, or staging and commit waits).",
            by_rank, buckets=CKPT_BUCKETS, registry=reg,
        ).labels(**l)  # fmt: skip
        self.ckpt_save = Histogram(
            "gpufleet_job_checkpoint_save_duration_seconds",
            "Time from the start of a checkpoint save to its commit (async included).",
            by_rank, buckets=CKPT_BUCKETS, registry=reg,
        ).labels(**l)  # fmt: skip

    @classmethod
    def from_env(
        cls, job: str, rank: int, hang_timeout: float = 0.0, total_steps: int = 0
    ) -> JobMetrics | None:
        """Metrics if the launcher asked for them (PROMETHEUS_MULTIPROC_DIR set), else None."""
        if not os.environ.get(ENV_METRICS_DIR):
            return None
        return cls(job, rank, hang_timeout=hang_timeout, total_steps=total_steps)

    def record_checkpoint(self, step: int, save_seconds: float, blocking_seconds: float) -> None:
        """A committed checkpoint: its step, its save duration and how long it held up
        training."""
        self.last_checkpoint_step.set(step)
        self.ckpt_save.observe(save_seconds)
        self.ckpt_blocking.observe(blocking_seconds)

    def record_resume(self, step: int) -> None:
        """This attempt resumed from the checkpoint at ``step``."""
        self._once(RESUMED_FROM, "Step the last attempt resumed from.").set(step)
        self.last_checkpoint_step.set(step)

    def record_hang(self, step: int) -> None:
        """This worker's hang watchdog fires after ``step`` (it exits next)."""
        self._once(HUNG_AT, "Last step before the hang watchdog fired.").set(step)

    def _once(self, name: str, doc: str) -> Any:
        """A gauge made at its first use (registered once per process)."""
        if name not in self._lazy:
            self._lazy[name] = self._gauge(name, doc)
        return self._lazy[name]

    def record_step(self, step: int, seconds: float, data_wait: float, samples: int) -> None:
        self.step.set(step)
        self.steps.inc()
        self.samples.inc(samples)
        self.step_seconds.observe(seconds)
        self.data_wait.inc(data_wait)
        self.last_progress.set(time.time())
