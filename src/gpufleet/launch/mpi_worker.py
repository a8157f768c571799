"""``python -m gpufleet.launch.mpi_worker SSHD [ARGS...]``: an MPIJob worker's PID 1.

An MPIJob worker runs sshd; mpirun on the launcher starts the pod launcher (torchrun) on it
over SSH, so that process is sshd's grandchild in another session. When the kubelet stops the
pod (a preemption), SIGTERM goes to PID 1 only: with sshd there, the training processes never
hear it, take no preemption checkpoint and are killed at the end of the grace period.

This runs sshd as a child instead and, on SIGTERM, passes the signal on to every pod launcher
of this user in the pod (found in /proc: the same uid, ``gpufleet.launch.pod`` in the command
line), waits for them to finish their checkpoint and exit, then stops sshd. Its exit code is
sshd's, or 128+15 when it was stopped. No library does this for a pod; a shell ``trap`` could,
but not wait for processes that are not its children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.procs import pid_alive

MARKER = "gpufleet.launch.pod"


def launchers(uid: int, marker: str = MARKER, proc: Path = Path("/proc")) -> list[int]:
    """Pids of this user's processes whose command line contains ``marker`` (not ours)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(marker.encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m gpufleet.launch.mpi_worker SSHD [ARGS...]", file=sys.stderr)
        return 2
    sshd = subprocess.Popen(args)
    stopping = False

    def on_term(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while sshd.poll() is None and not stopping:
        time.sleep(0.2)
    if not stopping:
        return sshd.returncode
    targets = launchers(os.getuid())
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    print(
        f"gpufleet: SIGTERM passed to {len(targets)} pod launcher(s)", file=sys.stderr, flush=True
    )
    while any(pid_alive(pid) for pid in targets):  # the kubelet's grace period bounds this
        time.sleep(0.2)
    sshd.terminate()
    try:
        sshd.wait(timeout=5)
    except subprocess.TimeoutExpired:
        sshd.kill()
    return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
