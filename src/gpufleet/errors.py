"""One exception tree and the exit codes every part of gpufleet shares.

Exit codes mean the same thing locally and inside pods, so restart policies can use them:

* ``EXIT_OK`` (0) - the job succeeded.
* ``EXIT_FAILED`` (1) - the job failed (a worker failed after all restarts, or another error).
* ``EXIT_BAD_INPUT`` (2) - the spec or the command line is wrong; nothing was started.
* ``EXIT_HUNG`` (3) - a worker's hang watchdog fired (no step progress within ``hangTimeout``);
  the launcher restarts the group, like any other worker failure.
* ``EXIT_NO_CHECKPOINT`` (4) - checkpoints exist but none is usable (every complete one failed
  its checksums and was set aside); nothing was trained. No restart can fix it: ``--fresh``
  starts over, or restore a checkpoint.
* ``EXIT_NON_FINITE`` (5) - the loss (or the weights about to be checkpointed) became NaN or
  infinite; stopped before that state was checkpointed, the last good checkpoint kept.
* ``EXIT_STORAGE`` (6) - checkpoint storage refused a save (disk full, quota, read-only,
  permission): no restart can fix it; the complete checkpoints stay loadable.
* ``EXIT_PREEMPTED`` (75, ``EX_TEMPFAIL``) - stopped by SIGTERM/SIGINT *after* a preemption
  checkpoint was committed; running the same job again resumes from it. Retriable. A pod's
  launcher also exits 75 when the rendezvous host (pod 0) is lost after the group formed
  (gpufleet.launch.pod): the same retry resumes from the last checkpoint.

The tree (every error gpufleet raises on purpose; anything else is a bug and keeps its
traceback)::

    GpufleetError                 exit 1
    ├── UserInputError            exit 2: a spec, file or option is wrong (FieldError paths)
    ├── JobConfigError            a job's runtime settings cannot work (also a ValueError)
    ├── CheckpointError           checkpoint storage refused what a save needs
    │   ├── NoUsableCheckpointError   exit 4, fatal: every complete checkpoint is corrupt
    │   ├── CheckpointMismatchError   exit 2, fatal: the checkpoint is another job's or model's
    │   ├── ReshardError              exit 2, fatal: this world size cannot split its global batch
    │   ├── CheckpointKeyError        exit 2, fatal: no key, or another key, for an encrypted one
    │   └── CheckpointStorageError    exit 6, fatal: disk full, quota, read-only, permission
    ├── NonFiniteError            exit 5, fatal: NaN/Inf loss or weights
    ├── MetricsPortError          the metrics port cannot be opened (also an OSError)
    ├── ServingError              Triton died or its models never became ready (gpufleet serve)
    ├── JobLockedError            another run of the same job holds its directory (gpufleet run)
    ├── ClusterError              the cluster said no (gpufleet.cluster)
    ├── RayClusterError           a Ray job's local Ray cluster did not start (gpufleet run)
    └── ClusterUpError            a local control plane's component did not start or get ready
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_HUNG = 3
EXIT_NO_CHECKPOINT = 4
EXIT_NON_FINITE = 5
EXIT_STORAGE = 6
EXIT_PREEMPTED = 75


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose."""

    exit_code: int = EXIT_FAILED
    # Fatal: no restart can fix it. A worker that raises one records it (gpufleet.launch.fatal)
    # and its agent stops restarting the group, so the job ends at once with this exit code.
    fatal: bool = False


@dataclass(frozen=True)
class FieldError:
    """One problem in user input: where it is, what is wrong, and (when known) the YAML line."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}" if self.path else "<document>"
        if self.line is not None:
            where += f" (line {self.line})"
        return f"{where}: {self.message}"


class JobConfigError(GpufleetError, ValueError):
    """A job's runtime settings cannot work (a batch larger than a rank's share of the data).
    Also a ValueError, as the Trainer raised before the tree had it."""


class CheckpointError(GpufleetError):
    """Checkpoint storage refused what a save needs (no unused directory name, ...)."""


class NoUsableCheckpointError(CheckpointError):
    """Checkpoints exist but every complete one is corrupt: resuming is impossible and
    starting from step 0 would silently throw the training away."""

    exit_code = EXIT_NO_CHECKPOINT
    fatal = True


class NonFiniteError(GpufleetError):
    """Training produced a NaN or infinite loss (or weights): going on would only train and
    checkpoint garbage, and a restart from the last checkpoint would meet the same batch."""

    exit_code = EXIT_NON_FINITE
    fatal = True

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step  # the first step whose loss or weights were not finite


class CheckpointMismatchError(CheckpointError):
    """The newest checkpoint in the job's checkpoint directory belongs to another job, or was
    written by another model: resuming from it would train the wrong thing, or crash every
    rank on a missing key. Bad input (the spec's checkpoint.dir), exit 2."""

    exit_code = EXIT_BAD_INPUT
    fatal = True


class ReshardError(CheckpointError):
    """A checkpoint cannot continue at this world size: its global batch does not split over
    the workers evenly (a changed batch would change the training). Bad input, exit 2."""

    exit_code = EXIT_BAD_INPUT
    fatal = True


class CheckpointKeyError(CheckpointError):
    """A durable checkpoint is encrypted (spec.checkpoint.durable.encryption) and the job has
    no key, or another key, than the one it was written with: the message names both key ids.
    Bad input, exit 2: no restart brings the key."""

    exit_code = EXIT_BAD_INPUT
    fatal = True


class CheckpointStorageError(CheckpointError):
    """Storage refused a checkpoint save for a reason no restart fixes (ENOSPC, EDQUOT,
    EROFS, EACCES, EPERM). Transient errors (a flaky object store request) are not this."""

    exit_code = EXIT_STORAGE
    fatal = True


class MetricsPortError(GpufleetError, OSError):
    """The metrics port cannot be opened (in use, not allowed). Also an OSError, as before."""

    option = "--port"  # which setting is to blame: --port or --address


class ServingError(GpufleetError):
    """``gpufleet serve``: tritonserver died, or a model never became READY. Exit 1, so a
    supervisor (systemd, the kubelet) restarts the server."""


class JobLockedError(GpufleetError):
    """Another run of the same job holds its directory."""


class ClusterError(GpufleetError):
    """The cluster said no (forbidden, conflict, unreachable): exit 1 with its words."""


class RayClusterError(GpufleetError):
    """A node of a Ray job's local Ray cluster did not start (its log's last lines attached)."""


class ClusterUpError(GpufleetError):
    """A component of the local control plane did not start or did not become ready (its log's
    last lines attached)."""


class UserInputError(GpufleetError):
    """Bad input from the user: a spec, a file or a command-line value. Exit code 2."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, errors: list[FieldError], source: str | None = None) -> None:
        self.errors = errors
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: " if self.source else ""
        n = len(self.errors)
        lines = [f"{head}{n} error{'s' if n != 1 else ''}"]
        lines += [f"  - {e}" for e in self.errors]
        return "\n".join(lines)
