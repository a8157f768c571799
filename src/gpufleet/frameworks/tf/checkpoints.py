"""A TensorFlow job's checkpoints: tf.train.Checkpoint's files in gpufleet's step directories.

Each save is ``<root>/step_<9 digits>-<6 hex>/ckpt.{index,data-*}`` (TensorFlow's own format,
written by ``tf.train.Checkpoint.write``) with gpufleet's ``COMPLETE.json`` beside it, exactly
as a PyTorch job's DCP directories have it: the SHA-256 of every file and the job's identity.
So the same rules hold: a directory without its marker is torn and never loaded, a corrupt one
is set aside with a warning and the previous one tried, another job's is refused, and
``gpufleet checkpoints verify`` checks either kind. tf.train.CheckpointManager keeps every save
in one directory with a shared ``checkpoint`` index file, which would leave no per-save unit to
mark complete, verify or set aside; it is therefore not used.

With MultiWorkerMirroredStrategy every worker must write (the save may run collectives); the
chief (task 0) writes into the step directory, the others into a temporary directory removed
after (TensorFlow's documented pattern). Imports no TensorFlow: the caller passes ``write``.
"""

from __future__ import annotations

from gpufleet.frameworks.stepdirs import PREFIX as PREFIX  # tf.train.Checkpoint's file prefix
from gpufleet.frameworks.stepdirs import StepCheckpoints
from gpufleet.runtime import integrity

# What the chief tells the other workers of a checkpoint (tf.distribute all-reduces by sum or
# mean only, so the others add zeros): a verdict and the step directory's name, as numbers a
# float32 holds exactly (below 2**24): the step in two 16-bit halves, the 6-hex suffix.
NONE, FOUND, NO_USABLE, REFUSED, FAILED = 0, 1, 2, 3, 4


def encode(verdict: int, name: str | None) -> list[float]:
    """``verdict`` and the step directory ``name`` (or None) as the numbers to agree on."""
    match = integrity.STEP_DIR.match(name or "")
    step, suffix = (int(match.group(1)), int(match.group(2), 16)) if match else (0, 0)
    return [float(verdict), float(step >> 16), float(step & 0xFFFF), float(suffix)]


def decode(values: list[int]) -> tuple[int, str | None]:
    """The verdict and directory name ``encode`` made, after the sum."""
    verdict, high, low, suffix = values
    name = f"step_{(high << 16) | low:09d}-{suffix:06x}" if verdict == FOUND else None
    return verdict, name


class TfCheckpoints(StepCheckpoints):
    """A TensorFlow job's step directories (tf.train.Checkpoint's files)."""

    framework = "TensorFlow"
    format = "tf.train.Checkpoint"
