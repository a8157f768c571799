"""Processes by pid (the local control plane's components, an MPI worker's pod launchers), and
waits that let signal handlers run."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

# Python runs a signal's handler in the main thread, and only between bytecodes. The kernel may
# deliver a signal sent to the process to any of its threads (a server's, a progress bar's): a
# main thread blocked in an untimed wait then sleeps on, the handler unrun, until the wait ends
# by itself. Waits in steps of this many seconds run it at the latest one step late.
HANDLER_STEP_S = 0.5


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_for(event: threading.Event) -> None:
    """``event.wait()`` in steps (HANDLER_STEP_S), so that a signal handler setting it runs."""
    while not event.wait(HANDLER_STEP_S):
        pass


def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """``proc.wait()`` in steps (HANDLER_STEP_S), so that signal handlers run meanwhile."""
    while True:
        try:
            return proc.wait(HANDLER_STEP_S)
        except subprocess.TimeoutExpired:
            pass
