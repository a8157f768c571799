"""The MPIJob launcher's wait: mpirun starts once every worker in the operator's hostfile
resolves and accepts SSH, and after the wait runs anyway with one line saying who is missing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpufleet.launch.mpi_launcher import ENV_HOSTFILE, hosts


def launcher(hostfile: Path, port: int, wait: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gpufleet.launch.mpi_launcher", f"--ssh-port={port}",
               f"--wait={wait}", "--", sys.executable, "-c", "print('mpirun ran')"]  # fmt: skip
    env = {**os.environ, ENV_HOSTFILE: str(hostfile)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_hostfile_names() -> None:
    text = "# the operator's\na-worker-0.a.ns.svc slots=1\n\na-worker-1.a.ns.svc slots=1 # x\n"
    path = Path("/tmp") / f"hostfile-{os.getpid()}"
    path.write_text(text)
    try:
        assert hosts(path) == ["a-worker-0.a.ns.svc", "a-worker-1.a.ns.svc"]
    finally:
        path.unlink()


def test_mpirun_waits_for_the_workers_ssh(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    (tmp_path / "hostfile").write_text("localhost slots=1\n")
    # the worker's sshd starts listening 1.5 s after the launcher
    timer = threading.Timer(1.5, server.listen)
    started = time.monotonic()
    timer.start()
    try:
        done = launcher(tmp_path / "hostfile", port, wait=30)
    finally:
        timer.cancel()
        server.close()
    assert done.returncode == 0 and done.stdout == "mpirun ran\n", done.stderr
    assert time.monotonic() - started >= 1.5
    assert done.stderr == ""


def test_after_the_wait_mpirun_runs_anyway_and_says_who_is_missing(tmp_path: Path) -> None:
    (tmp_path / "hostfile").write_text("no-such-worker.invalid slots=1\n")
    done = launcher(tmp_path / "hostfile", 2222, wait=1)
    assert done.returncode == 0 and done.stdout == "mpirun ran\n"
    assert done.stderr.strip().splitlines() == [
        "gpufleet: after 1 s, no SSH on port 2222 of no-such-worker.invalid; starting mpirun anyway"
    ]
