"""A local run's page: its state, launches, curves, checkpoints and rank 0's last log lines,
all read from its run directory (gpufleet.runtime.rundir), so a finished run keeps its page."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.dashboard.curves import ATTEMPT, Curves, attempt_number
from gpufleet.launch.runs import LocalRun, held_locks, local_run
from gpufleet.runtime import integrity
from gpufleet.runtime.files import read_json
from gpufleet.runtime.rundir import CHECKPOINTS_DIR, RunDir

TAIL = 200  # log lines shown


@dataclass
class RunPage:
    """Everything a local run's page shows."""

    run: LocalRun
    launches: list[dict[str, Any]]
    curves: Curves
    checkpoints: list[integrity.Entry]
    log: list[str]
    message: str | None = None
    attempts: list[str] = field(default_factory=list)


def attempt_dirs(run_dir: Path) -> list[Path]:
    """Every attempt of every launch (``logs/node0/<run id>/attempt_<n>``), oldest first."""
    launches = sorted((RunDir(run_dir).node_logs(0)).glob("*/"), key=lambda p: p.stat().st_mtime)
    tries = [sorted(launch.glob(f"{ATTEMPT}*"), key=lambda p: attempt_number(p.name))
             for launch in launches]  # fmt: skip
    return [attempt for launch in tries for attempt in launch]


def _lines(path: Path) -> Iterator[str]:
    with contextlib.suppress(OSError), path.open(errors="replace") as fh:
        yield from fh


def run_page(run_root: Path, name: str) -> RunPage | None:
    """The page of job ``name``'s run; None when there is no such run directory."""
    run_dir = run_root / name
    if not run_dir.is_dir() or name.startswith("."):
        return None
    files = RunDir(run_dir)
    attempts = attempt_dirs(run_dir)
    curves = Curves()
    for attempt in attempts:
        curves.add(_lines(attempt / "0" / "stdout.log"))
    log: deque[str] = deque(maxlen=TAIL)
    for stream in ("stdout.log", "stderr.log") if attempts else ():
        log.extend(f"[{stream.split('.')[0]}] {line.rstrip()}"
                   for line in _lines(attempts[-1] / "0" / stream))  # fmt: skip
    result = read_json(files.result) or {}
    return RunPage(
        run=local_run(run_root, name, held_locks()),
        launches=list((read_json(files.state) or {}).get("launches") or []),
        curves=curves,
        checkpoints=_checkpoints(run_dir, result.get("checkpoint")),
        log=list(log),
        message=(read_json(files.fatal) or {}).get("message"),
        attempts=[f"{a.parent.name}/{a.name}" for a in attempts],
    )


def _checkpoints(run_dir: Path, newest: str | None) -> list[integrity.Entry]:
    """The run's checkpoints, each verified: its own directory, or the spec's (the parent of
    the newest checkpoint the run wrote)."""
    import fsspec

    root = Path(newest).parent if newest and "://" not in newest else run_dir / CHECKPOINTS_DIR
    return integrity.survey(fsspec.filesystem("file"), str(root))
