"""The node's durable-tier uploader in a launcher (``gpufleet run``, the pod's launcher): started
before the workers, it runs for the whole launch, restarts included, and at the end waits for
the newest checkpoint's upload (gpufleet.runtime.durable)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufleet.runtime.context import CheckpointSettings
from gpufleet.runtime.durable import Uploader, UploadState, tiers
from gpufleet.runtime.files import write_json_atomic
from gpufleet.runtime.rundir import RunDir

# How long a finished job waits for its last checkpoint to become durable. A preempted one
# waits at most its grace period (the kubelet's SIGKILL ends it anyway).
FINAL_UPLOAD_WAIT = 600.0


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

    uploader = Uploader(fast, durable, keep=settings.durable_keep, on_change=save).start()
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
    if state.never_durable:
        log(f"gpufleet: checkpoints never copied to the durable tier: step "
            f"{', '.join(map(str, state.never_durable))} (superseded by a newer one before "
            "their upload, or their uploads failed)")  # fmt: skip
    return {"root": uploader.durable.root, "newest": state.newest_durable, "complete": drained,
            "never_durable": state.never_durable, "error": state.error}  # fmt: skip
