"""Keep children from outliving their parent, even when the parent is SIGKILLed."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


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
