"""Fatal worker errors: recorded once, and no restart after them.

torchrun restarts a failed worker group up to ``--max-restarts`` times whatever the cause. For
an error no restart can fix (every checkpoint corrupt, ...) that only repeats the failure and
hides its message under restarts. So a worker that raises a fatal ``GpufleetError`` (the
``fatal`` attribute) writes ``fatal.json`` into its run directory - the first one wins - and exits
with the error's own exit code; the agent, which PyTorch constructs inside
``torch.distributed.launcher.api.launch_agent``, is our subclass that stops restarting once that
file exists; the launcher (``gpufleet run`` or the pod's) reports its message in one line and
exits with its code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufleet.runtime.rundir import FATAL_FILE as FATAL_FILE
from gpufleet.runtime.rundir import RunDir


def write_fatal(run_dir: Path, exit_code: int, message: str, rank: int | None) -> bool:
    """Record a fatal error; False when one was already there (another rank's), kept."""
    data = json.dumps({"exit_code": exit_code, "message": message, "rank": rank}).encode()
    try:
        fd = os.open(RunDir(run_dir).fatal, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def read_fatal(run_dir: Path) -> dict[str, Any] | None:
    """The recorded fatal error, if any (a half-written file counts as none)."""
    try:
        data = json.loads(RunDir(run_dir).fatal.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None


@contextmanager
def no_restart_after_fatal(run_dir: Path, *, preempted: bool = False) -> Iterator[None]:
    """While active, the elastic agents PyTorch's launcher creates do not restart a failed
    worker group once ``run_dir`` holds a fatal error, nor, with ``preempted`` (a pod's
    launcher), once its workers stopped after a preemption checkpoint. A pod's workers stop so
    when another pod got the SIGTERM: an eviction deletes the pods one by one, so this pod's
    own comes later, or on a drain never. A restarted group would wait in a rendezvous that no
    pod joins, where the late SIGTERM may not reach the agent before the kubelet's SIGKILL
    (exit 137, not 75: seen once in CI); the launcher exits 75 at once instead. PyTorch has no
    option for it; its launcher names the agent class as a module global, which we swap for a
    subclass (the same in every torch of gpufleet's range: `make compat` runs
    tests/unit/test_fatal.py and tests/integration/test_local_run.py at the floor and the
    newest)."""
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    files = RunDir(run_dir)

    class Agent(LocalElasticAgent):
        def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
            result: RunResult = super()._monitor_workers(worker_group)
            stopped = files.fatal.exists() or (preempted and files.preempted.exists())
            if result.is_failed() and stopped:
                self._remaining_restarts = 0
            return result

        def _initialize_workers(self, worker_group: WorkerGroup) -> None:
            # A group that starts again after a membership change (a node joined: an elastic
            # job grew) was stopped by its own agent's SIGTERM, and its workers may have taken
            # a preemption checkpoint on it: that is no preemption of this pod.
            if preempted:
                files.preempted.unlink(missing_ok=True)
            super()._initialize_workers(worker_group)

    names = vars(launcher_api)  # the module's globals, where launch_agent looks the class up
    original = names["LocalElasticAgent"]
    names["LocalElasticAgent"] = Agent
    try:
        yield
    finally:
        names["LocalElasticAgent"] = original
