"""``gpufleet cluster up | down | status``: a real Kubernetes control plane on this machine.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from their Go modules
(``controlplane/``), nodes of one kind (``nodes.NodeKind``: kwok's fake GPU nodes today) and
the controllers (``addons``). Each runs as its own process in a new session, so it outlives the
command that started it; ``down`` ends them. Everything lives in one state directory:
certificates, kubeconfigs, etcd's data, logs and ``state.json`` (pids and ports).

``up`` is three steps: ``preflight`` (what the user asked for can work, before anything
starts), ``plan`` (ports, certificates, kubeconfigs and the control plane's command lines) and
``start`` (each component once the one before is ready; the nodes; the controllers).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.devcluster import addons
from gpufleet.devcluster.addons import Addon
from gpufleet.devcluster.addons.sealed import may_unshare, service_account_dir
from gpufleet.devcluster.api import Api
from gpufleet.devcluster.build import ensure_built
from gpufleet.devcluster.components import (
    KUBERNETES_SERVICE_IP,
    Component,
    etcd,
    kube_apiserver,
    kube_controller_manager,
    kube_scheduler,
)
from gpufleet.devcluster.controllers import Controllers
from gpufleet.devcluster.kwok import KwokNodes
from gpufleet.devcluster.nodes import NodeContext, NodeKind, NodeSpec
from gpufleet.devcluster.pki import Pki, make_pki, write_encryption_config, write_kubeconfig
from gpufleet.devcluster.processes import Processes, stop_all
from gpufleet.devcluster.realnodes import host
from gpufleet.devcluster.state import DEFAULT_DIR, State
from gpufleet.errors import ClusterUpError, FieldError, UserInputError
from gpufleet.extras import require
from gpufleet.net import free_ports, port_free

LOOPBACK = "127.0.0.1"
# The control plane's clients with a kubeconfig of their own (the PKI's CLIENTS).
CLIENT_KUBECONFIGS = ("kube-controller-manager", "kube-scheduler", "kwok")


def preflight(without: tuple[str, ...], with_: tuple[str, ...] = ()) -> list[Addon]:
    """The controllers to run (the optional ones only when ``with_`` names them), once
    ``without`` and ``with_`` name only known projects and leave no controller without one it
    needs (UserInputError, exit 2, otherwise)."""
    unknown = sorted(set(without) - set(addons.PROJECTS))
    if unknown:
        raise UserInputError([FieldError("--without", (
            f"unknown controller {', '.join(unknown)}; "
            f"one of: {', '.join(addons.PROJECTS)}"))])  # fmt: skip
    unknown = sorted(set(with_) - set(addons.OPTIONAL))
    if unknown:
        raise UserInputError([FieldError("--with", (
            f"unknown optional controller {', '.join(unknown)}; "
            f"one of: {', '.join(addons.OPTIONAL)}"))])  # fmt: skip
    enabled = [a for a in addons.ADDONS
               if a.project not in without and (not a.optional or a.project in with_)]  # fmt: skip
    for addon in enabled:
        lacking = [r for r in addon.requires if r in without]
        if lacking:
            raise UserInputError([FieldError("--without", (
                f"{addon.name} needs {', '.join(lacking)}; leave {addon.name} out too "
                f"(--without {addon.name})"))])  # fmt: skip
        if addon.in_cluster and not may_unshare():
            raise UserInputError([FieldError("--with", (
                f"{addon.project} needs root: its controller reads only a pod's ServiceAccount "
                "files, which it gets in a mount namespace of its own"))])  # fmt: skip
    return enabled


def check_fixed_ports(enabled: list[Addon]) -> None:
    """A controller that always listens on a port (fixed in its source) finds it free."""
    for addon in enabled:
        busy = [p for p in addon.fixed_ports if not port_free(p)]
        if busy:
            raise ClusterUpError(
                f"{addon.name} always listens on port {', '.join(map(str, busy))} (fixed in "
                "its source), which another program (another local cluster?) holds; stop it "
                f"or leave the controller out: --without {addon.name}"
            )


def node_kinds(
    nodes: NodeSpec | list[NodeSpec] | NodeKind | list[NodeKind], pod_delay_ms: int | None
) -> list[NodeKind]:
    """The kinds of node of a cluster: pools of NodeSpec are kwok's."""
    listed: list[Any] = nodes if isinstance(nodes, list) else [nodes]
    pools = [n for n in listed if isinstance(n, NodeSpec)]
    kinds: list[NodeKind] = [n for n in listed if not isinstance(n, NodeSpec)]
    return ([KwokNodes(pools, pod_delay_ms)] if pools else []) + kinds


def port_names() -> list[str]:
    """Every listener of the cluster: the control plane's and three per controller."""
    names = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    return names + [f"{a.name}-{use}" for a in addons.ADDONS
                    for use in ("webhook", "health", "metrics")]  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What ``start`` runs: the recorded state (ports, server), the PKI, the control plane."""

    state: State
    pki: Pki
    control_plane: list[Component]


class LocalCluster:
    """The control plane in ``directory``: ``up()``, ``down()``, ``status()``."""

    def __init__(self, directory: Path = DEFAULT_DIR, log: Callable[[str], None] | None = None):
        self.dir = directory.resolve()
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.api = Api(self.kubeconfig)

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig users point KUBECONFIG at."""
        return self.dir / "kubeconfig"

    def up(
        self,
        nodes: NodeSpec | list[NodeSpec] | NodeKind | list[NodeKind],
        *,
        timeout: float = 120,
        without: tuple[str, ...] = (),
        with_: tuple[str, ...] = (),
        kueue: addons.KueueSettings | None = None,
        pod_delay_ms: int | None = None,
    ) -> State:
        """Start every component in order, each once the one before is ready; create the nodes.
        ``nodes``: pools of kwok's fake nodes (``pod_delay_ms`` caps kwok's delays at each step
        of a pod's life), or kinds of node (kwok's, real ones) side by side. ``without`` names
        controllers (addons.PROJECTS) to leave out, as on a cluster that lacks them, ``with_``
        the optional ones to run (addons.OPTIONAL);
        ``kueue``: gpufleet's Kueue settings changed (fair sharing, the pods-ready timeout). A
        running cluster in the same directory is found and returned as it is."""
        kinds = node_kinds(nodes, pod_delay_ms)
        enabled = preflight(without, with_)
        require("cluster", "cryptography", "kubernetes")
        running = self.state_if_running()
        if running is not None:
            self.log(f"already running: {running.server}")
            return running
        self.down(quiet=True)
        check_fixed_ports(enabled)  # after down: our own last cluster's are free now
        address = next((k.api_address for k in kinds if k.api_address != LOOPBACK), LOOPBACK)
        plan = self.plan(ensure_built(self.log), address)
        try:
            for kind in kinds:
                kind.prepare(self.dir, self.log)
            self.start(plan, kinds, enabled, kueue or addons.KueueSettings(), timeout)
        except BaseException:
            plan.state.write(self.dir)
            self.down(quiet=True)
            raise
        plan.state.complete = True
        plan.state.write(self.dir)
        return plan.state

    def plan(self, binaries: Path, address: str = LOOPBACK) -> Plan:
        """Ports (all held at once while chosen: one port never goes to two listeners), the
        PKI, the control plane's kubeconfigs and command lines; the API server on
        ``address``."""
        pki = make_pki(self.dir / "pki", sorted({LOOPBACK, address, KUBERNETES_SERVICE_IP}))
        write_encryption_config(pki)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        names = port_names()
        ports = dict(zip(names, free_ports(len(names), cluster=True), strict=True))
        server = f"https://{address}:{ports['kube-apiserver']}"
        state = State(ports=ports, server=server, binaries=str(binaries))
        configs = {u: write_kubeconfig(self.dir / f"{u}.kubeconfig", server, pki, u)
                   for u in CLIENT_KUBECONFIGS}  # fmt: skip
        write_kubeconfig(self.kubeconfig, server, pki, "admin")
        control_plane = [
            etcd(binaries / "etcd", self.dir / "etcd-data", ports["etcd"], ports["etcd-peer"]),
            kube_apiserver(
                binaries / "kube-apiserver", pki, ports["kube-apiserver"], ports["etcd"], address
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
        ]
        return Plan(state, pki, control_plane)

    def start(
        self, plan: Plan, kinds: list[NodeKind], enabled: list[Addon],
        kueue: addons.KueueSettings,
        timeout: float,
    ) -> None:  # fmt: skip
        """The control plane, each component once the one before is ready; the nodes' objects
        and processes; the controllers; the CRDs of projects that do not run here."""
        processes = Processes(self.dir, plan.state, self.log)
        for component in plan.control_plane:
            processes.start(component, timeout)
        binaries = Path(plan.state.binaries)
        ctx = NodeContext(binaries, self.dir, lambda user: self.dir / f"{user}.kubeconfig",
                          self.api, plan.pki, plan.state.server)  # fmt: skip
        for kind in kinds:
            self.api.create_all(kind.objects())
            kind.start(ctx, processes, timeout)
        controllers = Controllers(binaries, self.dir, plan.pki, plan.state.server, self.api,
                                  processes, timeout, self.log)  # fmt: skip
        controllers.start_all(enabled, kueue)
        controllers.install_other_crds()

    def state_if_running(self) -> State | None:
        """The recorded state when ``up`` ended well and every component is still alive."""
        state = State.read(self.dir)
        if state is None or not state.complete:
            return None
        return state if all(state.alive(name) for name in state.pids) else None

    def down(self, *, quiet: bool = False) -> list[str]:
        """Stop every component this directory's state names (SIGTERM, then SIGKILL after
        10 s), newest first; remove etcd's data. Returns the names stopped."""
        state = State.read(self.dir)
        if state is None:
            host.undo(self.dir, None if quiet else self.log)  # a crash before any process
            return []
        stopped = stop_all(state, None if quiet else self.log)
        host.undo(self.dir, None if quiet else self.log)
        state.remove(self.dir)
        shutil.rmtree(self.dir / "etcd-data", ignore_errors=True)
        for addon in (a for a in addons.ADDONS if a.in_cluster):  # their tokens
            shutil.rmtree(service_account_dir(addon, self.dir), ignore_errors=True)
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
