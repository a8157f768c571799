"""`gpufleet run` of a Ray job: its Ray cluster on this machine (cluster.LocalRayCluster), then
its driver (the job's command, or the built-in workload's) run once against it, its output on
the console prefixed ``[driver]:`` and kept in ``<run dir>/logs/driver.log``. SIGTERM and
SIGINT go to the driver as SIGTERM; the cluster ends with the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpufleet.errors import EXIT_FAILED, EXIT_OK
from gpufleet.frameworks.ray.cluster import LocalRayCluster
from gpufleet.launch.local import forward_signals
from gpufleet.launch.node import NodeOutcome
from gpufleet.procs import wait_exit
from gpufleet.runtime.rundir import RunDir
from gpufleet.spec import TrainingJob

PREFIX = "[driver]: "
TAIL_LINES = 20


def run_ray(
    job: TrainingJob,
    run_dir: Path,
    argv: list[str],
    env: dict[str, str],
    secret_env: dict[str, str],
) -> NodeOutcome:
    """The job's Ray cluster and driver (``argv``, a worker's command line); how the driver
    ended."""
    s = job.spec
    logs = RunDir(run_dir).logs
    with LocalRayCluster(nodes=s.nodes, cpus=s.procs_per_node, log_dir=logs) as cluster:
        driver_env = {**os.environ, **env, **secret_env, **cluster.env}
        proc = subprocess.Popen(argv, env=driver_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        with forward_signals([proc]):
            tail = _tee(proc, logs / "driver.log")
            code = wait_exit(proc)
    if code == EXIT_OK:
        return NodeOutcome(exit_code=EXIT_OK)
    if code < 0:  # a signal ended the driver: interrupted, or preempted before a checkpoint
        return NodeOutcome(exit_code=128 - code, signal=-code)
    message = f"job {job.metadata.name} failed: its Ray driver ended with exit code {code}"
    message += f"\nlast lines of {logs / 'driver.log'}:\n" + "\n".join(f"  {ln}" for ln in tail)
    return NodeOutcome(exit_code=EXIT_FAILED, failed_exitcode=code, failed_message=message)


def _tee(proc: subprocess.Popen[bytes], log: Path) -> list[str]:
    """Copy the driver's output to the console (prefixed) and to ``log``; its last lines."""
    assert proc.stdout is not None
    tail: list[str] = []
    with log.open("ab") as out:
        for raw in proc.stdout:
            out.write(raw)
            out.flush()
            line = raw.decode(errors="replace").rstrip("\n")
            sys.stdout.write(PREFIX + line + "\n")
            sys.stdout.flush()
            if line.strip():
                tail = [*tail[-(TAIL_LINES - 1) :], line]
    return tail
