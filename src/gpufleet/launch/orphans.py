"""Keep children from outliving their parent, even when the parent is SIGKILLed."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


ENV_AGENT_PID = "GPUFLEET_AGENT_PID"


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies.

    torch's elastic agent starts workers in new sessions (so a terminal's Ctrl-C reaches only the
    agent, which forwards it). That also means nothing kills them if the agent is SIGKILLed.
    PR_SET_PDEATHSIG closes that gap; the stdlib has no wrapper for prctl, hence ctypes.
    ``expected_parent`` (the agent's pid) catches a parent that died before this call.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if expected_parent is not None and parent != expected_parent:
        os.kill(os.getpid(), sig)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def die_with_grandparent(grandparent: int | None, sig: int = signal.SIGKILL) -> None:
    """``die_with_parent`` for a worker forked by its agent's forkserver: it dies with the
    forkserver, which exits when the agent's end of its pipe closes (the agent's death, a
    SIGKILL too); ``grandparent`` (the agent's pid) catches either having died before this."""
    if not sys.platform.startswith("linux"):
        return
    die_with_parent(sig)
    if grandparent is not None and _parent_of(os.getppid()) != grandparent:
        os.kill(os.getpid(), sig)


def release_forkserver() -> None:
    """In a process forked by a multiprocessing forkserver: close the copy of the "alive" pipe's
    write end that the forkserver hands each child. The server leaves its loop only once every
    copy is closed, so a worker keeping it would keep the server alive after its agent died,
    and with it itself (its death signal is the server's). A forkserver the worker asks for
    later is a new one. The attributes are the stdlib's private ones (3.11 to 3.13)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]
        server._forkserver_address = None  # type: ignore[attr-defined]


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm) state"


def name_process(name: str) -> None:
    """Set this process's name (``/proc/self/comm``: what ps -e, top and pgrep show; Linux keeps
    15 bytes), as prctl(PR_SET_NAME) does; the stdlib has no wrapper."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
