"""A Ray cluster on this machine for `gpufleet run` of a Ray job: a head and one Ray node per
node of the spec, each Ray's own `ray start --block` in a process group of its own, so it and
everything it starts (GCS, raylet, agents, workers) end by its PID, never by name (`ray stop`
ends every Ray process of the machine, other users' too).

Ray binds its GCS, raylets and agents to every interface and rewrites 127.0.0.1 to the host's
address (it has no setting for either): the cluster turns on Ray's token authentication with a
token made for the run, passed in the environment only, so no other program reaches it.
Every port is chosen here (free_ports), as several Ray nodes on one host need distinct ones."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.errors import RayClusterError
from gpufleet.frameworks.ray import RAY_ENV
from gpufleet.net import free_ports

# The ports one Ray node listens on, by `ray start`'s option.
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
WORKER_PORTS = 8  # a node's worker processes beyond one per CPU (the controller, Ray's own)
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # small: the digits job moves no objects
START_TIMEOUT_S = 90.0
STOP_GRACE_S = 3.0  # then SIGKILL: a local cluster keeps no state worth a graceful end
STARTED = "Ray runtime started."  # what `ray start` prints once its node is up
# `ray start`, ended with the launcher even when that is SIGKILLed (PR_SET_PDEATHSIG; Ray ends
# the node's processes with it), run by this Python whatever its scripts directory holds.
RAY_START = (
    "import sys; from gpufleet.launch.orphans import die_with_parent; die_with_parent(); "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
)


def ray_env(token: str) -> dict[str, str]:
    """What every process of the cluster and its driver share: the token, and RAY_ENV."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, **RAY_ENV}


@dataclass
class LocalRayCluster:
    """``nodes`` Ray nodes of ``cpus`` CPUs each, and a head that runs no work (0 CPUs)."""

    nodes: int
    cpus: int
    log_dir: Path
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    address: str = ""
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _temp: Path | None = None
    _metrics_port: int = 0

    @property
    def env(self) -> dict[str, str]:
        """The driver's environment additions: the head's address and the token."""
        return {"RAY_ADDRESS": self.address, **ray_env(self.token)}

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """The head, then each node once the one before is up (Ray numbers a node's files by
        the nodes it sees: two starting at once collide)."""
        # Short: Ray makes unix sockets below it, whose paths have at most 107 bytes.
        self._temp = Path(tempfile.mkdtemp(prefix="gfray-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        workers = WORKER_PORTS + self.cpus  # a port per worker process: Train's and Ray's own
        per_node = len(NODE_PORTS) + workers
        gcs, dashboard, client, metrics, *ports = free_ports(4 + (1 + self.nodes) * per_node)
        self.address = f"127.0.0.1:{gcs}"
        self._metrics_port = metrics
        for index in range(1 + self.nodes):
            mine = ports[index * per_node : (index + 1) * per_node]
            named = [f"--{name}={port}" for name, port in zip(NODE_PORTS, mine, strict=False)]
            listed = ",".join(map(str, mine[len(NODE_PORTS) :]))
            if index == 0:
                # The dashboard serves Ray's state API, which Ray Train's controller asks.
                role = ["--head", f"--port={gcs}", "--num-cpus=0", "--include-dashboard=true",
                        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
                        f"--ray-client-server-port={client}",
                        f"--temp-dir={self._temp}"]  # fmt: skip
            else:
                # The nodes share the head's session directory: the head's log monitor
                # alone sends the workers' output to the driver (each would send it again).
                role = [f"--address={self.address}", f"--num-cpus={self.cpus}",
                        "--include-log-monitor=false"]  # fmt: skip
            name = "head" if index == 0 else f"node{index - 1}"
            self._start_node(name, [*role, *named, f"--worker-port-list={listed}"], timeout)

    def _start_node(self, name: str, args: list[str], timeout: float) -> None:
        log = self.log_dir / f"ray-{name}.log"
        argv = [sys.executable, "-c", RAY_START, "start", "--block", "--disable-usage-stats",
                f"--object-store-memory={OBJECT_STORE_BYTES}", *args]  # fmt: skip
        # The dashboard's own metrics port is fixed (44227) unless its environment names one.
        env = {
            **os.environ,
            **ray_env(self.token),
            "DASHBOARD_METRIC_PORT": str(self._metrics_port),
        }
        with log.open("wb") as out:  # its own session: Ctrl-C reaches the launcher alone
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
        self._procs.append(proc)
        deadline = time.monotonic() + timeout
        while STARTED not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                why = f"exited {proc.returncode}" if proc.poll() is not None else "timed out"
                raise RayClusterError(f"Ray node {name} did not start ({why}; {log}):\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Every node's process group, newest first: SIGTERM, SIGKILL after STOP_GRACE_S
        (Ray's head does not end on SIGTERM alone); then its files."""
        for proc in reversed(self._procs):
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            _signal_group(proc.pid, signal.SIGKILL)  # what the node started lives on in it
            proc.wait()
        self._procs.clear()
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
