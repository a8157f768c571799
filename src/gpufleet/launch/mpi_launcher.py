"""``python -m gpufleet.launch.mpi_launcher [--ssh-port P] [--wait S] -- MPIRUN [ARGS...]``: an
MPIJob launcher's command.

mpirun reaches each worker over SSH by the name in the hostfile the MPI operator mounts
(``OMPI_MCA_orte_default_hostfile``: ``<job>-worker-<i>.<job>.<namespace>.svc``). That name
resolves only once the worker's pod is in the operator's headless Service, and ssh does not
retry a name that does not resolve ("Could not resolve hostname"): a launcher that starts before
its workers fails the job with no training done (seen on real nodes, every time under Kueue).
The operator's own wait (``launcherCreationPolicy: WaitForWorkersReady``) does not apply to a
job that starts suspended, as every job Kueue admits does (MPI operator 0.8.2: the launcher Job
is created at once, suspended, and resumed with the workers).

So this waits until every worker's name resolves and its sshd accepts a connection, at most
``--wait`` seconds, then execs mpirun. After the wait (or without a hostfile) mpirun runs as it
would, and says itself what it could not reach.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

ENV_HOSTFILE = "OMPI_MCA_orte_default_hostfile"  # set by the MPI operator for OpenMPI
WORKER_WAIT = 120.0  # seconds for every worker to resolve and accept SSH


def hosts(hostfile: Path) -> list[str]:
    """The host names of an Open MPI hostfile (``name slots=N`` lines; ``#`` comments)."""
    lines = (line.split("#", 1)[0].split() for line in hostfile.read_text().splitlines())
    return [words[0] for words in lines if words]


def reachable(host: str, port: int) -> bool:
    """Whether ``host`` resolves and accepts a TCP connection on ``port``."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:  # socket.gaierror (no such name yet) is an OSError too
        return False


def wait_for(names: list[str], port: int, timeout: float) -> list[str]:
    """Wait until every host is reachable, at most ``timeout`` seconds; the ones that are not."""
    deadline = time.monotonic() + timeout
    waiting = list(names)
    while waiting:
        waiting = [h for h in waiting if not reachable(h, port)]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return waiting


def main(argv: list[str] | None = None) -> int:
    """Wait for the hostfile's workers, then exec the command (mpirun); 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet.launch.mpi_launcher")
    parser.add_argument("--ssh-port", type=int, default=22)
    parser.add_argument("--wait", type=float, default=WORKER_WAIT)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command (mpirun ...) after --")
    hostfile = Path(os.environ.get(ENV_HOSTFILE, ""))
    if hostfile.name and hostfile.is_file():
        missing = wait_for(hosts(hostfile), args.ssh_port, args.wait)
        if missing:
            said = f"no SSH on port {args.ssh_port} of {', '.join(missing)}"
            print(f"gpufleet: after {args.wait:.0f} s, {said}; starting mpirun anyway",
                  file=sys.stderr, flush=True)  # fmt: skip
    os.execvp(command[0], command)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
