"""The node's durable-tier uploader in a launcher (``gpufleet run``, the pod's launcher): started
before the workers, it runs for the whole launch, restarts included, and at the end waits for
the newest checkpoint's upload (gpufleet.runtime.durable)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufleet.runtime.context import CheckpointSettings
from gpufleet.runtime.durable import Uploader, UploadState, tiers
from gpufleet.runtime.files import read_json, write_json_atomic
from gpufleet.runtime.metrics import (
    DURABLE_LAG_SECONDS,
    DURABLE_LAG_STEPS,
    DURABLE_STEP,
    UPLOAD_FAILURES,
)
from gpufleet.runtime.rundir import RunDir
from gpufleet.runtime.sealed import read_key

# How long a finished job waits for its last checkpoint to become durable. A preempted one
# waits what is left of its grace period (the kubelet's SIGKILL ends it anyway) less
# GRACE_MARGIN, the launcher's time to keep the logs and exit.
FINAL_UPLOAD_WAIT = 600.0
GRACE_MARGIN = 2.0


def upload_wait(run_dir: Path, grace: float) -> float:
    """How long the launcher waits for the last upload: FINAL_UPLOAD_WAIT, or, after a
    preemption checkpoint, what is left of the ``grace`` period since the workers' signal."""
    mark = read_json(RunDir(run_dir).preempted)
    if not isinstance(mark, dict):
        return FINAL_UPLOAD_WAIT
    since = mark.get("signalled_at")
    used = time.time() - since if isinstance(since, (int, float)) else 0.0
    return max(0.0, grace - used - GRACE_MARGIN)


@contextmanager
def durable_uploads(
    settings: CheckpointSettings,
    job: str,
    run_dir: Path,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Iterator[Uploader | None]:
    """Run the uploader of a job with a durable tier (None without one) while the block runs;
    its state is kept in the run directory's ``durable.json`` as it changes."""
    if not settings.durable:
        yield None
        return
    state_file = RunDir(run_dir).durable
    fast, durable = tiers(settings.root(run_dir), settings.durable, job, log)

    def save(state: UploadState) -> None:
        write_json_atomic(state_file, state.to_json())

    key = read_key(settings.key_file)  # CheckpointKeyError before any upload, without one
    uploader = Uploader(fast, durable, keep=settings.durable_keep, on_change=save, key=key)
    uploader.start()
    try:
        yield uploader
    finally:
        save(uploader.stop())


def finish(uploader: Uploader | None, timeout: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Wait up to ``timeout`` seconds for the newest checkpoint to be durable, stop the
    uploader, and say how the durable tier ends: the run summary's ``durable`` ({} without a
    durable tier), each checkpoint that never reached it named."""
    if uploader is None:
        return {}
    drained = uploader.drain(timeout)
    state = uploader.stop()
    if not drained:
        log(f"gpufleet: WARNING the checkpoint of step {state.newest_fast} did not reach the "
            f"durable tier {uploader.durable.root} within {timeout:g} s ("
            f"{state.error or 'still uploading'}); the newest durable one is step "
            f"{state.newest_durable}")  # fmt: skip
    if never := state.never_durable:
        steps = ", ".join(map(str, [*never[:3], "...", *never[-3:]] if len(never) > 8 else never))
        log(f"gpufleet: {len(never)} checkpoint(s) never copied to the durable tier: step "
            f"{steps} (superseded by a newer one before their upload, or their uploads "
            "failed)")  # fmt: skip
    return {"root": uploader.durable.root, "newest": state.newest_durable, "complete": drained,
            "never_durable": state.never_durable, "error": state.error}  # fmt: skip


class DurableCollector:
    """The node's uploader's state (its ``durable.json``) as Prometheus series, read at each
    scrape: the uploader runs in this process's thread, the metrics server in another, and
    the file is what both already share (and outlives a scrape that comes mid-update)."""

    def __init__(self, state_file: Path, job: str) -> None:
        self.state_file, self.job = state_file, job

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state = read_json(self.state_file)
        if not isinstance(state, dict):
            return
        lag = UploadState(**{k: v for k, v in state.items() if k in UploadState.__annotations__})
        label = ["job_name"]
        families: list[tuple[Any, str, str, float | None]] = [
            (GaugeMetricFamily, DURABLE_STEP, "Newest step verified on the durable tier.",
             lag.newest_durable),
            (GaugeMetricFamily, DURABLE_LAG_STEPS, "Steps between the newest committed "
             "checkpoint and the newest durable one.", lag.lag_steps()),
            (GaugeMetricFamily, DURABLE_LAG_SECONDS, "Seconds since the oldest committed "
             "checkpoint not yet durable was committed (0: none waiting).", lag.lag_seconds()),
            (CounterMetricFamily, UPLOAD_FAILURES, "Failed uploads to the durable tier.",
             lag.failures),
        ]  # fmt: skip
        for kind, name, doc, value in families:
            if value is not None:
                family = kind(name, doc, labels=label)
                family.add_metric([self.job], float(value))
                yield family
