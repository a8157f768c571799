"""The ranks' logs kept beside the job's checkpoints: a cluster's pod logs go with its pods
(replaced after a crash, deleted on eviction, preemption or a finished job's clean-up), so each
pod's launcher copies its ranks' log files there when it exits, and ``gpufleet logs`` reads them
back once the pods are gone (``python -m gpufleet.launch.keptlogs DIR`` in a pod that mounts
what the job's pods mount, with their environment: a PVC, or an object store's credentials).

Layout: ``<checkpoint dir>/logs/<start>-<pod>/`` holds the pod's torchelastic log directory as
torchelastic wrote it (``<run_id>_<rand>/attempt_<n>/<local rank>/{stderr,stdout}.log``);
``<start>`` is the launcher's start (UTC, ``YYYYmmddTHHMMSSZ``), so names sort in time order.
Kept at exit: a launcher killed at once (SIGKILL, a lost node) keeps nothing. The checkpoints'
``keep`` never removes them (only ``step_*`` directories are checkpoints).
"""

from __future__ import annotations

import os
import posixpath
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODULE = "gpufleet.launch.keptlogs"
KEPT_DIR = "logs"  # under the checkpoint directory
STREAMS = ("stderr.log", "stdout.log")  # each rank's files, in the order they are shown
KEEP_TIMEOUT = 10.0  # seconds for the copy at exit


def kept_name(started: float, pod: str) -> str:
    """The directory name of one launcher's logs: its start time (to the millisecond: an
    Indexed Job's replacement pod has the same hostname), then its pod."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    return f"{stamp}.{int(started * 1000) % 1000:03d}Z-{pod}"


def _copy(files: list[Path], log_dir: Path, dest: str) -> None:
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, root = fsspec.core.url_to_fs(dest)
    for path in files:
        target = posixpath.join(root, path.relative_to(log_dir).as_posix())
        # an object store has no directories (and its makedirs may try to make a bucket)
        if isinstance(fs, LocalFileSystem):
            fs.makedirs(posixpath.dirname(target), exist_ok=True)
        fs.put_file(str(path), target)


def keep(
    log_dir: Path, checkpoint_dir: str, name: str, timeout: float = KEEP_TIMEOUT
) -> str | None:
    """Copy every file under ``log_dir`` to ``<checkpoint_dir>/logs/<name>/``, in at most
    ``timeout`` seconds (the pod's grace period may be nearly spent); where, or None when there
    was nothing to keep or it failed. Never raises: a failure is one line on stderr, and the
    launcher's exit code stays the job's."""
    dest = f"{checkpoint_dir.rstrip('/')}/{KEPT_DIR}/{name}"
    failed: list[BaseException] = []
    try:
        files = sorted(p for p in log_dir.rglob("*") if p.is_file()) if log_dir.is_dir() else []
        if not files:
            return None

        def copy() -> None:
            try:
                _copy(files, log_dir, dest)
            except Exception as exc:  # any storage's error (OSError, an object store's)
                failed.append(exc)

        worker = threading.Thread(target=copy, daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            failed.append(TimeoutError(f"not done in {timeout:.0f} s"))
    except Exception as exc:  # reading the pod's own log directory
        failed.append(exc)
    if failed:
        print(f"gpufleet: could not keep the ranks' logs in {dest}: {failed[0]}", file=sys.stderr)
        return None
    return dest


def _attempt_key(rel: str) -> tuple[str, str, int, int, int]:
    """Sort key of ``<launcher>/<run>/attempt_<n>/<rank>/<stream>``: launcher (time order),
    attempt, rank, stderr before stdout."""
    launcher, run, attempt, rank, stream = rel.split("/")
    n = int(attempt.removeprefix("attempt_")) if attempt.startswith("attempt_") else -1
    return launcher, run, n, int(rank) if rank.isdigit() else -1, STREAMS.index(stream)


def kept_lines(fs: Any, root: str, tail: int | None = None) -> Iterator[str]:
    """Every kept rank log under ``root`` (``<checkpoint dir>/logs``), oldest launcher first,
    each line prefixed ``[<launcher> attempt <n> rank <r>]`` (rank: the pod's local rank);
    with ``tail``, the last ``tail`` lines of each file (a rank's stderr, then its stdout)."""
    try:
        found = fs.find(root)
    except FileNotFoundError:
        return
    rels = [posixpath.relpath(f, root) for f in found]
    logs = [r for r in rels if r.count("/") == 4 and r.rsplit("/", 1)[1] in STREAMS]
    for rel in sorted(logs, key=_attempt_key):
        launcher, _, attempt, rank, _ = rel.split("/")
        tag = f"[{launcher} {attempt.replace('_', ' ')} rank {rank}]"
        with fs.open(posixpath.join(root, rel), "rb") as fh:  # line by line: logs can be large
            lines = (raw.decode(errors="replace").rstrip("\r\n") for raw in fh)
            yield from (f"{tag} {line}" for line in (deque(lines, tail) if tail else lines))


def main(argv: list[str] | None = None) -> int:
    """``[--tail N] [CHECKPOINT_DIR]``: print the logs kept under a checkpoint directory (a
    path, a URI, or the job's own: its durable tier's, else ``GPUFLEET_CHECKPOINT_DIR``); 1
    when there are none."""
    import argparse

    import fsspec

    from gpufleet.runtime.context import ENV_CHECKPOINT_DIR, kept_logs_root

    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--tail", type=int, default=None)
    parser.add_argument("where", nargs="?", default=kept_logs_root(os.environ))
    args = parser.parse_args(argv)
    if not args.where:
        parser.error(f"no checkpoint directory: give one or set {ENV_CHECKPOINT_DIR}")
    where = args.where.rstrip("/")
    fs, root = fsspec.core.url_to_fs(f"{where}/{KEPT_DIR}")
    printed = 0
    for line in kept_lines(fs, root, args.tail):
        print(line)
        printed += 1
    if not printed:
        print(f"no logs kept in {where}/{KEPT_DIR}", file=sys.stderr)
    return 0 if printed else 1


if __name__ == "__main__":
    sys.exit(main())
