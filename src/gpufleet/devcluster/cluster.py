"""``gpufleet cluster up | down | status``: a real Kubernetes control plane on this machine.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from their Go modules
(``controlplane/``), and kwok for nodes with GPUs and the lifecycle of their pods. Each runs as
its own process in a new session, so it outlives the command that started it; ``down`` ends
them. Everything lives in one state directory: certificates, kubeconfigs, etcd's data, logs and
``state.json`` (pids and ports).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devcluster.components import (
    KWOK_NODE_ANNOTATION,
    Component,
    etcd,
    kube_apiserver,
    kube_controller_manager,
    kube_scheduler,
    kwok,
)
from gpufleet.devcluster.pki import Pki, make_pki
from gpufleet.errors import FieldError, GpufleetError, UserInputError
from gpufleet.net import free_port

DEFAULT_DIR = Path(".gpufleet/cluster")
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
REPO = Path(__file__).resolve().parents[3]  # a checkout: where .tools/ and scripts/ are
STAGES = Path(__file__).with_name("stages")  # gpufleet's own kwok Stages (exit codes)
# Pod annotations for gpufleet's exit-code Stage (tests put them in pod templates).
EXIT_CODE_ANNOTATION = "gpufleet.dev/exit-code"
EXIT_AFTER_ANNOTATION = "gpufleet.dev/exit-after"  # milliseconds
NOT_KWOK_COMPLETE = {"pod-complete.stage.kwok.x-k8s.io/weight": "0"}


def exit_with(code: int, after_ms: int = 500) -> dict[str, str]:
    """Pod annotations that make a kwok pod end with exit ``code`` ``after_ms`` once Running."""
    return {EXIT_CODE_ANNOTATION: str(code), EXIT_AFTER_ANNOTATION: str(after_ms),
            **NOT_KWOK_COMPLETE}  # fmt: skip


class ClusterUpError(GpufleetError):
    """A component did not start or did not become ready (its log's last lines attached)."""


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """The fake nodes: count, GPUs each and their product (GPU feature discovery labels)."""

    count: int = 2
    gpus: int = 2
    gpu_product: str = "NVIDIA-A30"
    gpu_memory_mib: int = 24576
    cpu: str = "32"
    memory: str = "256Gi"


@dataclass
class State:
    """What ``up`` started: pids and ports by component, the API server's URL."""

    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    server: str = ""
    binaries: str = ""  # where the components' executables are (to recognise our processes)

    @classmethod
    def read(cls, directory: Path) -> State | None:
        try:
            data = json.loads((directory / "state.json").read_text())
            return cls(
                pids=dict(data["pids"]),
                ports=dict(data["ports"]),
                server=str(data["server"]),
                binaries=str(data.get("binaries", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self, name: str) -> bool:
        """Whether component ``name`` still runs: its pid is alive and is still our binary (a
        pid of a long-dead component may have been given to another program since)."""
        pid = self.pids.get(name)
        if pid is None or not pid_alive(pid):
            return False
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except OSError:
            return False
        return argv0 == str(Path(self.binaries) / name)

    def write(self, directory: Path) -> None:
        path = directory / "state.json"
        path.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n")


def binaries_dir() -> Path:
    """Where the built components are: $GPUFLEET_CONTROLPLANE_BIN, else the checkout's
    .tools/controlplane."""
    return Path(os.environ.get("GPUFLEET_CONTROLPLANE_BIN", REPO / ".tools" / "controlplane"))


def ensure_built(log: Callable[[str], None]) -> Path:
    """The binaries' directory, building what is missing with scripts/build-controlplane.sh."""
    where = binaries_dir()
    if all((where / name).is_file() for name in COMPONENTS):
        return where
    script = REPO / "scripts" / "build-controlplane.sh"
    if not script.is_file():
        missing = [n for n in COMPONENTS if not (where / n).is_file()]
        raise UserInputError(
            [
                FieldError(
                    "GPUFLEET_CONTROLPLANE_BIN",
                    f"{where} lacks {', '.join(missing)}; build them with "
                    "scripts/build-controlplane.sh from a gpufleet checkout",
                )
            ]
        )
    log("building the control plane from controlplane/go.mod (a first build takes minutes)")
    subprocess.run(["bash", str(script), *COMPONENTS], check=True)
    return where


def require_extra() -> None:
    """The cluster extra (kubernetes client, cryptography) or exit 2 saying how to get it."""
    try:
        import cryptography  # noqa: F401
        import kubernetes  # noqa: F401
    except ImportError as exc:
        raise UserInputError(
            [FieldError(exc.name or "cluster", "needs: pip install 'gpufleet[cluster]'")]
        ) from exc


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours (started by this process and exited) also answers kill 0.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def kubeconfig(path: Path, server: str, pki: Pki, user: str) -> Path:
    """A kubeconfig for ``user`` (a client certificate of the PKI) at ``path``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpufleet-local",
                "cluster": {"server": server, "certificate-authority": str(pki.ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki.cert(user)),
                    "client-key": str(pki.key(user)),
                },
            }
        ],
        "contexts": [
            {"name": "gpufleet-local", "context": {"cluster": "gpufleet-local", "user": user}}
        ],
        "current-context": "gpufleet-local",
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")  # JSON is YAML
    path.chmod(0o600)
    return path


def node_object(name: str, nodes: NodeSpec, index: int) -> dict[str, Any]:
    """A Node kwok manages, with its capacity (kept as created) and GPU discovery labels."""
    key, value = KWOK_NODE_ANNOTATION
    capacity = {"cpu": nodes.cpu, "memory": nodes.memory, "pods": "110"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "topology.kubernetes.io/zone": f"zone-{index % 2}",
    }
    taints = []
    if nodes.gpus:
        capacity["nvidia.com/gpu"] = str(nodes.gpus)
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": nodes.gpu_product,
            "nvidia.com/gpu.count": str(nodes.gpus),
            "nvidia.com/gpu.memory": str(nodes.gpu_memory_mib),
        }
        taints = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {key: value}},
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


class LocalCluster:
    """The control plane in ``directory``: ``up()``, ``down()``, ``status()``."""

    def __init__(self, directory: Path = DEFAULT_DIR, log: Callable[[str], None] | None = None):
        self.dir = directory.resolve()
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig users point KUBECONFIG at."""
        return self.dir / "kubeconfig"

    def up(self, nodes: NodeSpec, *, timeout: float = 120) -> State:
        """Start every component in order, each once the one before is ready; create the nodes.
        A running cluster in the same directory is found and returned as it is."""
        require_extra()
        running = self.state_if_running()
        if running is not None:
            self.log(f"already running: {running.server}")
            return running
        self.down(quiet=True)
        binaries = ensure_built(self.log)
        pki = make_pki(self.dir / "pki")
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        ports = {
            "etcd": free_port(),
            "etcd-peer": free_port(),
            "kube-apiserver": free_port(),
            "kube-controller-manager": free_port(),
            "kube-scheduler": free_port(),
        }
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        state = State(ports=ports, server=server, binaries=str(binaries))
        configs = {u: kubeconfig(self.dir / f"{u}.kubeconfig", server, pki, u)
                   for u in ("kube-controller-manager", "kube-scheduler", "kwok")}  # fmt: skip
        kubeconfig(self.kubeconfig, server, pki, "admin")
        stages = sorted((binaries / "kwok-stages").glob("*.yaml")) + sorted(STAGES.glob("*.yaml"))
        plan = [
            etcd(binaries / "etcd", self.dir / "etcd-data", ports["etcd"], ports["etcd-peer"]),
            kube_apiserver(
                binaries / "kube-apiserver", pki, ports["kube-apiserver"], ports["etcd"]
            ),
            kube_controller_manager(
                binaries / "kube-controller-manager",
                pki,
                configs["kube-controller-manager"],
                ports["kube-controller-manager"],
            ),
            kube_scheduler(
                binaries / "kube-scheduler", configs["kube-scheduler"], ports["kube-scheduler"]
            ),
            kwok(
                binaries / "kwok", configs["kwok"], stages, lambda: self._nodes_ready(nodes.count)
            ),
        ]
        try:
            for component in plan:
                if component.name == "kwok":
                    self._create_nodes(nodes)
                self._start(component, state, timeout)
        except BaseException:
            state.write(self.dir)
            self.down(quiet=True)
            raise
        state.write(self.dir)
        return state

    def _start(self, component: Component, state: State, timeout: float) -> None:
        started = time.monotonic()
        log_path = self.dir / "logs" / f"{component.name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                component.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives `gpufleet cluster up`; `down` ends it
            )
        state.pids[component.name] = proc.pid
        state.write(self.dir)
        while not component.ready():
            if proc.poll() is not None:
                raise ClusterUpError(
                    f"{component.name} exited with {proc.returncode} while starting; "
                    f"last lines of {log_path}:\n{tail(log_path)}"
                )
            if time.monotonic() - started > timeout:
                raise ClusterUpError(
                    f"{component.name} not ready after {timeout:g} s; last lines of "
                    f"{log_path}:\n{tail(log_path)}"
                )
            time.sleep(0.2)
        self.log(f"  {component.name} ready ({time.monotonic() - started:.1f} s)")

    def _core(self) -> Any:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        return client.CoreV1Api(api)

    def _create_nodes(self, nodes: NodeSpec) -> None:
        core = self._core()
        for i in range(nodes.count):
            core.create_node(node_object(f"gpu-node-{i}", nodes, i))

    def _nodes_ready(self, count: int) -> bool:
        from gpufleet.cluster.client import api_errors

        try:
            listed = self._core().list_node().items
        except api_errors():  # the API may still be settling; readiness is polled again
            return False
        ready = [
            n for n in listed
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        ]  # fmt: skip
        return len(ready) >= count

    def state_if_running(self) -> State | None:
        """The recorded state when every component is alive and the API server is ready."""
        state = State.read(self.dir)
        if state is None or set(state.pids) != set(COMPONENTS):
            return None
        return state if all(state.alive(name) for name in COMPONENTS) else None

    def down(self, *, quiet: bool = False) -> list[str]:
        """Stop every component this directory's state names (SIGTERM, then SIGKILL after
        10 s), newest first; remove etcd's data. Returns the names stopped."""
        state = State.read(self.dir)
        if state is None:
            return []
        stopped = []
        for name in reversed([n for n in COMPONENTS if n in state.pids]):
            pid = state.pids[name]
            if not state.alive(name):  # gone, or its pid now belongs to another program
                continue
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
            stopped.append(name)
            if not quiet:
                self.log(f"  stopped {name}")
        (self.dir / "state.json").unlink(missing_ok=True)
        shutil.rmtree(self.dir / "etcd-data", ignore_errors=True)
        return stopped

    def status(self) -> dict[str, str]:
        """Each component: "running" or "exited (see <log>)"; empty when nothing was started."""
        state = State.read(self.dir)
        if state is None:
            return {}
        return {
            name: "running" if state.alive(name) else f"exited (see {self.dir / 'logs' / name}.log)"
            for name in state.pids
        }


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
