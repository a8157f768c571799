"""Waits that let signal handlers run, whichever of the process's threads got the signal."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A handler set in the main thread; the signal sent to another thread (tgkill), as the kernel may
# deliver one sent to the process; the handler ends the child that the main thread waits for.
SCRIPT = textwrap.dedent("""
    import ctypes, os, signal, subprocess, sys, threading, time
    from gpufleet.procs import wait_exit, wait_for

    child = subprocess.Popen(["sleep", "60"])
    stop = threading.Event()

    def handler(*_):
        child.kill()
        stop.set()

    signal.signal(signal.SIGUSR1, handler)

    def other():
        time.sleep(0.5)  # the main thread is asleep in its wait by then (a signal before it
        # would run the handler whatever the wait)
        ctypes.CDLL(None).tgkill(os.getpid(), threading.get_native_id(), signal.SIGUSR1)

    threading.Thread(target=other).start()
    if sys.argv[1] == "event":
        wait_for(stop)
    print(wait_exit(child))
""")


def run(what: str) -> subprocess.CompletedProcess[str]:
    # An untimed wait would sleep on for the child's 60 s: the 30 s limit fails the test then.
    return subprocess.run([sys.executable, "-c", SCRIPT, what], capture_output=True, text=True,
                          timeout=30, check=True)  # fmt: skip


def test_wait_exit_runs_a_handler_whose_signal_reached_another_thread() -> None:
    assert run("process").stdout.strip() == "-9"


def test_wait_for_runs_a_handler_whose_signal_reached_another_thread() -> None:
    assert run("event").stdout.strip() == "-9"
