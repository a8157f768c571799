"""The local runs under a run root, for ``gpufleet jobs`` without a cluster: one per job
directory, read from the files the launcher and rank 0 keep there (gpufleet.runtime.rundir).

Whether a run is live comes from its lock (gpufleet.launch.lock): the kernel holds an flock
only while its ``gpufleet run`` lives. It is read from /proc/locks, never by taking the lock,
which would make a ``gpufleet run`` starting at that instant refuse to start. Where /proc/locks
cannot be read (not Linux), the PID the holder wrote stands in. A run whose lock was taken
after its last recorded launch, that got as far as running, and whose lock is no longer held,
was killed before it could record its end: Interrupted.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.console import camel_json
from gpufleet.runtime.files import read_json
from gpufleet.runtime.rundir import RunDir

PROC_LOCKS = Path("/proc/locks")


@dataclass
class LocalRun:
    """One job's run directory (``-o json``: these fields, camelCase)."""

    name: str
    state: str  # Running, Succeeded, Failed, Preempted, Interrupted, or Unknown (never launched)
    step: int | None
    steps: int | None
    loss: float | None
    eta_seconds: float | None
    restarts: int
    launches: int
    started: float | None  # the last run's start (seconds since the epoch)
    run_dir: str

    def as_dict(self) -> dict[str, Any]:
        as_json: dict[str, Any] = camel_json(self)
        return as_json


def held_locks() -> set[tuple[int, int]] | None:
    """(inode, holder's PID) of every flock held; None when /proc/locks is unreadable. The
    device is left out: on overlayfs, stat and /proc/locks name different devices for a file."""
    try:
        text = PROC_LOCKS.read_text()
    except OSError:
        return None
    held = set()
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter's line has "->" second)
        if len(fields) >= 6 and fields[1] == "FLOCK":
            held.add((int(fields[5].rsplit(":", 1)[1]), int(fields[4])))
    return held


def _live(lock: Path, info: dict[str, Any], held: set[tuple[int, int]] | None) -> bool:
    """Whether the ``gpufleet run`` that wrote ``info`` into ``lock`` still holds it."""
    with contextlib.suppress(KeyError, TypeError, ValueError, ProcessLookupError):
        pid = int(info["pid"])
        if held is not None:
            return (lock.stat().st_ino, pid) in held
        with contextlib.suppress(PermissionError):  # another user's process: it exists
            os.kill(pid, 0)
        return True
    return False


def _ran_since(files: RunDir, started: float) -> bool:
    """Whether a run that took its lock at ``started`` got as far as running: its rank 0 wrote
    progress or its agents a log directory since. A run refused after taking the lock (another
    job's checkpoint directory, a busy metrics port) wrote neither."""
    paths = [files.progress, *files.logs.glob("node*")]
    return any(p.exists() and p.stat().st_mtime >= started for p in paths)


def local_run(run_root: Path, name: str, held: set[tuple[int, int]] | None) -> LocalRun:
    """The run of job ``name`` as its directory and lock tell it."""
    files = RunDir(run_root / name)
    lock = run_root / f"{name}.lock"
    info = (read_json(lock) if lock.exists() else None) or {}
    launches = list((read_json(files.state) or {}).get("launches") or [])
    last = launches[-1] if launches else {}
    progress = read_json(files.progress) or {}
    result = read_json(files.result) or {}
    live = lock.exists() and _live(lock, info, held)
    if live:
        state = "Running"
    elif float(info.get("started") or 0) > float(last.get("started") or 0) and _ran_since(
        files, float(info["started"])
    ):
        state = "Interrupted"  # ran after the last launch it recorded, and is gone
    else:
        state = str(last.get("status") or "Unknown")
    restarts = sum(int(launch.get("restarts") or 0) for launch in launches)
    step = progress.get("step") if live else result.get("steps", progress.get("step"))
    steps = progress.get("steps") or (result.get("steps") if state == "Succeeded" else None)
    eta = None
    if live and progress.get("step_seconds") and steps and step is not None:
        eta = max(0.0, (int(steps) - int(step)) * float(progress["step_seconds"]))
    return LocalRun(
        name=name, state=state, step=step, steps=steps,
        loss=result.get("final_loss", progress.get("loss")) if not live else progress.get("loss"),
        eta_seconds=eta,
        restarts=restarts + (int(progress.get("restart_count") or 0) if live else 0),
        launches=len(launches) + (1 if live or state == "Interrupted" else 0),
        started=float(info["started"]) if info.get("started") else last.get("started"),
        run_dir=str(files.path),
    )  # fmt: skip


def local_runs(run_root: Path) -> list[LocalRun]:
    """Every job directory under ``run_root`` (not ``--fresh``'s archive), by name."""
    if not run_root.is_dir():
        return []
    held = held_locks()
    names = sorted(p.name for p in run_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [local_run(run_root, name, held) for name in names]


def age_of(run: LocalRun, now: float | None = None) -> float | None:
    """Seconds since the run's last start."""
    return None if run.started is None else (now or time.time()) - run.started
