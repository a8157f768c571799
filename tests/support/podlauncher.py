"""The rendered worker pod's command and environment, run on this machine as a pod would run
it (tests/integration/test_pod_launcher.py and the tiered checkpoints' tests)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpufleet.net import free_port
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.support.cli import cli_env
from tests.support.procs import poll_until
from tests.support.scrape import scrape_port, steps_by_rank
from tests.support.specs import cluster_job


def pod_process(
    workdir: Path,
    *,
    faults: str = "",
    node: int = 0,
    here: str = "",
    rdzv_conf: str = "",
    replacement: int = 0,
    extra_env: dict[str, str] | None = None,
    **spec: Any,
) -> tuple[subprocess.Popen[str], int]:
    """Start the rendered worker pod ``node``'s command here; returns it and its metrics port.
    Its rendezvous host is ``here`` (default: a free loopback port); ``rdzv_conf`` is passed
    as torchrun's ``--rdzv-conf``. Each pod has its own run directory (an emptyDir; a new one
    for the ``replacement``-th pod of the same index) and all share the checkpoint volume. The
    pod leads a process group of its own (a node). ``extra_env``: what the pod would get from
    elsewhere (a Secret's variables)."""
    port = free_port()
    job = validate_training_job(
        cluster_job(**{"nodes": 1, "procsPerNode": 2, "metrics": {"port": port}, **spec})
    )
    (_, indexed) = render(job, "job")
    (container,) = indexed["spec"]["template"]["spec"]["containers"]
    rdzv = f"{job.metadata.name}-0.{job.metadata.name}:29400"
    here = here or f"127.0.0.1:{free_port()}"
    command = [
        sys.executable if a == "python" else a.replace(rdzv, here) for a in container["command"]
    ]
    assert command[1:3] == ["-m", "gpufleet.launch.pod"]
    if rdzv_conf:  # beside the rendered one (an elastic job's last call), if any
        rendered = [a for a in command if a.startswith("--rdzv-conf=")]
        command = [a for a in command if a not in rendered]
        command.insert(3, ",".join([*(a.split("=", 1)[1] for a in rendered), rdzv_conf]))
        command[3] = f"--rdzv-conf={command[3]}"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (
        env["GPUFLEET_METRICS_PORT"] == str(port) and env["GPUFLEET_METRICS_ADDRESS"] == "0.0.0.0"
    )
    run = workdir / ("run" if node == 0 else f"run-{node}")
    run = run.with_name(f"{run.name}-{replacement}") if replacement else run
    # The pod's emptyDir and volume, moved here; listen on loopback only on a shared machine.
    env.update(
        GPUFLEET_RUN_DIR=str(run),
        PROMETHEUS_MULTIPROC_DIR=str(run / "metrics"),
        GPUFLEET_CHECKPOINT_DIR=str(workdir / "ckpt"),
        GPUFLEET_METRICS_ADDRESS="127.0.0.1",
    )
    if faults:
        env["GPUFLEET_FAULTS"] = faults
    env.update(extra_env or {})
    proc = subprocess.Popen(
        own_shm(command), cwd=workdir, env={**cli_env(), **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    return proc, port


# A mount namespace of its own with an empty tmpfs on /dev/shm, then the command (exec: the
# same process). What unshare(1) and mount(8) do; Python's stdlib has neither call.
OWN_SHM = ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
           'mount -t tmpfs -o mode=1777,size=256m shm /dev/shm && exec "$@"', "sh")  # fmt: skip


def own_shm(command: list[str]) -> list[str]:
    """``command`` with a /dev/shm of its own, as a pod gets one from its runtime: what it
    leaves there goes with it. A pod killed whole as a lost node (its process group SIGKILLed,
    multiprocessing's resource tracker with it) leaves its launcher's named semaphores behind;
    on a real node they go with the node, here they stayed in the host's /dev/shm. Root only
    (a mount namespace needs CAP_SYS_ADMIN); elsewhere the command as it is."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return command
    return [*OWN_SHM, *command]


def wait_for_steps(
    proc: subprocess.Popen[str], port: int, at_least: int, ranks: set[str] | None = None
) -> dict[str, float]:
    ranks = {"0", "1"} if ranks is None else ranks

    def stepped() -> dict[str, float] | None:
        steps = steps_by_rank(scrape_port(port)[1])
        return steps if set(steps) == ranks and min(steps.values()) >= at_least else None

    what = f"step {at_least} from both ranks on :{port}"
    return poll_until(stepped, what=what, alive=proc, retry_on=(OSError,))


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def kill_left(pods: list[subprocess.Popen[str]]) -> None:
    """SIGKILL the pods still running, each its process group (a node's), and reap them."""
    for proc in pods:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
