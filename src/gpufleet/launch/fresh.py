"""``gpufleet run --fresh``: a job's earlier checkpoints moved aside, never deleted."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec import TrainingJob


def set_checkpoints_aside(job: TrainingJob, echo: Callable[[str], None]) -> None:
    """``--fresh`` with a checkpoint directory outside the run directory, or a durable tier:
    move this job's checkpoints there into ``.archive/`` (never deleted; another job's stay),
    so the run really starts over. A remote directory is refused: moving objects is not ours
    to do."""
    c = job.spec.checkpoint
    if c.dir:
        _set_aside(job.metadata.name, c.dir, "spec.checkpoint.dir", echo)
    if c.durable:
        _set_aside(job.metadata.name, c.durable.dir, "spec.checkpoint.durable.dir", echo)


def _set_aside(name: str, uri: str, field: str, echo: Callable[[str], None]) -> None:
    import fsspec

    from gpufleet.runtime import integrity

    if "://" in uri and not uri.startswith("file://"):
        message = (
            f"--fresh cannot move checkpoints in {uri} aside; delete them (e.g. `aws s3 rm "
            f"--recursive {uri}`) or point {field} somewhere new, then run again"
        )
        raise UserInputError([FieldError(field, message)])
    root = Path(uri.removeprefix("file://"))
    if not root.is_dir():
        return
    archive = root / ".archive" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    moved = 0
    fs = fsspec.filesystem("file")
    for step_dir in sorted(root.iterdir()):
        if not integrity.STEP_DIR.match(step_dir.name):
            continue
        # Torn, or written before identities: unattributed, moved with ours.
        if integrity.owner(fs, str(step_dir)) not in (None, name):
            continue
        archive.mkdir(parents=True, exist_ok=True)
        shutil.move(str(step_dir), str(archive / step_dir.name))
        moved += 1
    if moved:
        echo(f"gpufleet: --fresh moved {moved} checkpoint(s) of {name} to {archive}")
