"""Local run directories as the launcher and rank 0 leave them (gpufleet.runtime.rundir), for
the tests of `gpufleet jobs` without a cluster and of the dashboard's local pages."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpufleet.runtime.rundir import RunDir
from tests.support.checkpoints import commit

ATTEMPT = "logs/node0/digits-1a2b_x/attempt_{}/0/stdout.log"


def run_dir(root: Path, name: str, *, launches: list[dict[str, Any]] | None = None,
            progress: dict[str, Any] | None = None, result: dict[str, Any] | None = None,
            locked_at: float | None = None) -> RunDir:  # fmt: skip
    """A job's run directory as the launcher leaves it: state.json's launches, rank 0's
    progress.json and result.json, and the lock file a run wrote when it started."""
    files = RunDir(root / name)
    files.path.mkdir(parents=True)
    for path, data in ((files.state, {"launches": launches} if launches else None),
                       (files.progress, progress), (files.result, result)):  # fmt: skip
        if data is not None:
            path.write_text(json.dumps(data))
    if locked_at is not None:
        info = {"job": name, "pid": os.getpid(), "started": locked_at}
        (root / f"{name}.lock").write_text(json.dumps(info))
    return files


def step_lines(*steps: int, total: int = 100) -> str:
    """Rank 0's log lines for ``steps`` (gpufleet.runtime.reporting's format)."""
    return "".join(f"step {s}/{total} loss {1 / s:.4f} {1000 + s:,} samples/s\n" for s in steps)


def restarted_run(root: Path, name: str = "digits") -> RunDir:
    """A finished run that restarted once (attempt 1 went back to step 40) and ended at step
    100, with three committed checkpoints, the one of step 80 corrupted."""
    t = time.time() - 3600
    files = run_dir(root, name, launches=[{"started": t, "status": "Succeeded", "restarts": 1}],
                    result={"steps": 100, "final_loss": 0.01}, locked_at=t - 1)  # fmt: skip
    for attempt, text in ((0, step_lines(20, 40, 60)), (1, step_lines(40, 60, 80, 100))):
        log = files.path / ATTEMPT.format(attempt)
        log.parent.mkdir(parents=True)
        log.write_text("gpufleet: resumed from step 40\n" * attempt + text)
    for step in (40, 80, 100):
        done = commit(str(files.path / "checkpoints"), step)
        if step == 80:
            (files.path / "checkpoints" / done / "__0_0.distcp").write_bytes(b"rot")
    return files
