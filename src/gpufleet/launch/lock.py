"""One ``gpufleet run`` per job: an exclusive lock on the job's run and checkpoint directories.

Two runs of one job (a second terminal, a cron job) would share the run directory and the
checkpoints and interfere. Each run takes ``flock(LOCK_EX | LOCK_NB)`` on a lock file beside the
run directory (``<runs>/<name>.lock``; beside it, not in it, so ``--fresh`` can move the run
directory aside while holding the lock) and on ``<checkpoint dir>/.gpufleet.lock`` when the
checkpoints live elsewhere on this machine. The kernel drops an flock when its holder dies,
SIGKILL included, so a lock never outlives its run. The holder writes its PID and start time
into the file, for the refusal message. Object-store checkpoint directories (``s3://``) are not
locked: an object store has no such lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from gpufleet.errors import JobLockedError

CHECKPOINT_LOCK = ".gpufleet.lock"


def _holder(path: Path) -> tuple[str, str]:
    """(the holding job's name, "pid N, started T") from the lock file."""
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return str(info["job"]), f"pid {int(info['pid'])}, started {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another job", "a process that is starting"


@contextlib.contextmanager
def _flock(path: Path, job: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, who = _holder(path)
            if holder == job:
                raise JobLockedError(
                    f"job {job} is already running ({who}; lock {path}): wait for it to end or "
                    "stop it; two runs of one job would share its run and checkpoint directories"
                ) from None
            raise JobLockedError(
                f"job {job}: checkpoint directory {path.parent} is in use by job {holder} "
                f"({who}; lock {path}); give each job its own spec.checkpoint.dir"
            ) from None
        info = {"job": job, "pid": os.getpid(), "started": time.time()}
        with contextlib.suppress(OSError):  # a full disk must not stop the run here
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a new holder)


@contextlib.contextmanager
def job_lock(run_root: Path, job: str, checkpoint_dir: str | None) -> Iterator[None]:
    """Hold the job's locks for the ``with`` body, or raise JobLockedError at once."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_flock(run_root / f"{job}.lock", job))
        if checkpoint_dir and ("://" not in checkpoint_dir or checkpoint_dir.startswith("file:")):
            local = Path(checkpoint_dir.removeprefix("file://"))
            stack.enter_context(_flock(local / CHECKPOINT_LOCK, job))
        yield
