"""The cluster's processes: each started in a new session (it outlives the command that started
it), recorded in the state as it starts, waited on until ready, started again a few times when
it exits while starting (as the kubelet restarts a container), and stopped by process group."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.devcluster.components import Component
from gpufleet.devcluster.state import State
from gpufleet.errors import ClusterUpError
from gpufleet.procs import pid_alive

STOP_GRACE_S = 10  # SIGTERM, then SIGKILL after this


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Processes:
    """Starts components for one cluster directory, recording each in ``state`` (from several
    threads: the controllers start side by side)."""

    def __init__(self, directory: Path, state: State, log: Callable[[str], None]) -> None:
        self.dir = directory
        self.state = state
        self.log = log
        self._lock = threading.Lock()

    def _launch(self, component: Component, log_path: Path) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                component.argv,
                env={**os.environ, **dict(component.env)} if component.env else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives `gpufleet cluster up`; `down` ends it
            )
        with self._lock:
            self.state.record(component.name, proc.pid)
            self.state.write(self.dir)
        return proc

    def start(self, component: Component, timeout: float, restarts: int = 0) -> None:
        """Run ``component`` and wait until it is ready. ``restarts``: how often it is started
        again when it exits before that, as the kubelet restarts a pod's container (a manager
        whose webhook server starts before its own certificate rotation has filled the Secret
        exits once, in a cluster too)."""
        started = time.monotonic()
        log_path = self.dir / "logs" / f"{component.name}.log"
        proc = self._launch(component, log_path)
        while not component.ready():
            if proc.poll() is not None:
                if restarts > 0:
                    restarts -= 1
                    self.log(f"  {component.name} exited with {proc.returncode} while starting; "
                             "started again (as the kubelet would)")  # fmt: skip
                    proc = self._launch(component, log_path)
                    continue
                raise ClusterUpError(
                    f"{component.name} exited with {proc.returncode} while starting; "
                    f"last lines of {log_path}:\n{tail(log_path)}"
                )
            if time.monotonic() - started > timeout:
                raise ClusterUpError(
                    f"{component.name} not ready after {timeout:g} s; last lines of "
                    f"{log_path}:\n{tail(log_path)}"
                )
            time.sleep(0.2)
        self.log(f"  {component.name} ready ({time.monotonic() - started:.1f} s)")


def stop_all(state: State, log: Callable[[str], None] | None = None) -> list[str]:
    """Stop every component ``state`` names that is still ours (SIGTERM to its process group,
    then SIGKILL after STOP_GRACE_S), newest first. Returns the names stopped."""
    stopped = []
    for name in reversed(state.started):
        pid = state.pids[name]
        if not state.alive(name):  # gone, or its pid now belongs to another program
            continue
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        stopped.append(name)
        if log is not None:
            log(f"  stopped {name}")
    return stopped
