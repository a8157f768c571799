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
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster import addons
from gpufleet.devcluster.components import (
    KWOK_NODE_ANNOTATION,
    Component,
    controller_runtime_manager,
    etcd,
    kube_apiserver,
    kube_controller_manager,
    kube_scheduler,
    kwok,
)
from gpufleet.devcluster.pki import Pki, make_pki
from gpufleet.errors import FieldError, GpufleetError, UserInputError
from gpufleet.net import free_ports, port_free
from gpufleet.procs import pid_alive

DEFAULT_DIR = Path(".gpufleet/cluster")
BASE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
COMPONENTS = (*BASE, *(a.name for a in addons.ADDONS))
REPO = Path(__file__).resolve().parents[3]  # a checkout: where .tools/ and scripts/ are
STAGES = Path(__file__).with_name("stages")  # gpufleet's own kwok Stages (exit codes, deletion)
# Pod annotations for gpufleet's exit-code Stage (tests put them in pod templates).
EXIT_CODE_ANNOTATION = "gpufleet.dev/exit-code"
EXIT_AFTER_ANNOTATION = "gpufleet.dev/exit-after"  # a Go duration ("500ms"); kwok ignores "500"
NOT_KWOK_COMPLETE = {"pod-complete.stage.kwok.x-k8s.io/weight": "0"}
# Pod annotations that keep a kwok pod Running for a day (kwok's pod-complete Stage waits its
# annotated delay): a job that holds its GPUs until cancelled or preempted.
RUN_FOR_A_DAY = {
    "pod-complete.stage.kwok.x-k8s.io/delay": "24h",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "24h",
}


# How often a controller's manager is started again when it exits before it is ready.
ADDON_RESTARTS = 3

NVIDIA_RUNTIME_CLASS: dict[str, Any] = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "nvidia"},
    "handler": "nvidia",
}


def exit_with(code: int, after_ms: int = 500) -> dict[str, str]:
    """Pod annotations that make a kwok pod end with exit ``code`` ``after_ms`` once Running."""
    return {EXIT_CODE_ANNOTATION: str(code), EXIT_AFTER_ANNOTATION: f"{after_ms}ms",
            **NOT_KWOK_COMPLETE}  # fmt: skip


class ClusterUpError(GpufleetError):
    """A component did not start or did not become ready (its log's last lines attached)."""


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """A pool of fake nodes: count, GPUs each and their product (GPU feature discovery
    labels), the name prefix and extra labels (a chart flavor's nodeLabels, topology)."""

    count: int = 2
    gpus: int = 2
    gpu_product: str = "NVIDIA-A30"
    gpu_memory_mib: int = 24576
    cpu: str = "32"
    memory: str = "256Gi"
    prefix: str = "gpu-node"
    labels: tuple[tuple[str, str], ...] = ()


def pools_from_values(
    values: dict[str, Any], count: int, gpus: int, gpu_product: str
) -> list[NodeSpec]:
    """Node pools for a platform chart values file: ``count`` nodes per flavor, carrying the
    flavor's nodeLabels (so Kueue's ResourceFlavors match them), GPUs on GPU flavors (product
    from the flavor's nvidia.com/gpu.product label, else ``gpu_product``), and a label for every
    topology level the chart's Kueue Topology names, nodes spread over two values of each."""
    topology = (values.get("kueue") or {}).get("topology") or {}
    levels = [lv for lv in topology.get("levels", []) if lv != "kubernetes.io/hostname"]
    flavors = values.get("flavors") or [{"name": "default", "gpu": gpus > 0, "nodeLabels": {}}]
    pools = []
    for flavor in flavors:
        labels = dict(flavor.get("nodeLabels") or {})
        product = labels.get("nvidia.com/gpu.product", gpu_product)
        pools.append(NodeSpec(count=count, gpus=gpus if flavor.get("gpu") else 0,
                              gpu_product=product, prefix=f"{flavor['name']}-node",
                              labels=tuple(sorted(labels.items())) + tuple(
                                  (lv, "") for lv in levels)))  # fmt: skip
    return pools


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


# Pods whose containers exit by themselves in a cluster: kwok's pod-complete Stage ends only
# those a Job owns (a Deployment's must keep running); the training-operator's kinds own their
# pods directly, and those end too. (The MPI operator's workers are not here: they run until
# its launcher, a Job, ends and the operator removes them.)
SELF_COMPLETING_OWNERS = ("PyTorchJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob")


def owner_complete_stage(kwok_stages: Path, directory: Path) -> Path:
    """kwok's own pod-complete Stage, for pods owned by SELF_COMPLETING_OWNERS instead of Job
    (same delays, annotations and status), written to ``directory``."""
    stage = yaml.safe_load((kwok_stages / "pod-complete.yaml").read_text())
    stage["metadata"]["name"] = "pod-complete-training-operator"
    owner_kind = [e for e in stage["spec"]["selector"]["matchExpressions"]
                  if e["key"] == ".metadata.ownerReferences.[].kind"]  # fmt: skip
    if len(owner_kind) != 1 or owner_kind[0]["values"] != ["Job"]:
        raise ClusterUpError(f"kwok's pod-complete Stage changed: {owner_kind}")
    owner_kind[0]["values"] = list(SELF_COMPLETING_OWNERS)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pod-complete-training-operator.yaml"
    path.write_text(yaml.safe_dump(stage, sort_keys=False))
    return path


def capped_pod_stages(kwok_stages: Path, directory: Path, cap_ms: int) -> Path:
    """kwok's Stages, each Pod Stage's own delay and jitter at most ``cap_ms``, written to
    ``directory``: kwok's wait 1 s plus up to 4 s more at each step of a pod's life (created,
    ready, completed), most of a short job's time. A delay a pod's annotation sets
    (RUN_FOR_A_DAY) still applies."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(kwok_stages.glob("*.yaml")):
        stage = yaml.safe_load(path.read_text())
        delay = stage["spec"].get("delay") or {}
        if stage["spec"]["resourceRef"]["kind"] == "Pod":
            for key in ("durationMilliseconds", "jitterDurationMilliseconds"):
                if key in delay:
                    delay[key] = min(delay[key], cap_ms)
        (directory / path.name).write_text(yaml.safe_dump(stage, sort_keys=False))
    return directory


def binaries_dir() -> Path:
    """Where the built components are: $GPUFLEET_CONTROLPLANE_BIN, else the checkout's
    .tools/controlplane."""
    return Path(os.environ.get("GPUFLEET_CONTROLPLANE_BIN", REPO / ".tools" / "controlplane"))


def ensure_built(log: Callable[[str], None]) -> Path:
    """The binaries' directory, building what is missing with scripts/build-controlplane.sh."""
    where = binaries_dir()
    needed = [where / n for n in COMPONENTS] + [manifests(where, a) for a in addons.ADDONS]
    needed += [
        where / "manifests" / f"{a.after_ready}.yaml" for a in addons.ADDONS if a.after_ready
    ]
    needed.append(where / "crds" / "keda.sh_scaledobjects.yaml")
    if all(path.is_file() for path in needed):
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


def manifests(binaries: Path, addon: addons.Addon) -> Path:
    """The install manifests of the addon's project, rendered from its module by the build."""
    owner = next(a for a in addons.ADDONS
                 if a.project_name == addon.project_name and a.manifest_name)  # fmt: skip
    return binaries / "manifests" / f"{owner.manifest_name}.yaml"


def require_extra() -> None:
    """The cluster extra (kubernetes client, cryptography) or exit 2 saying how to get it."""
    try:
        import cryptography  # noqa: F401
        import kubernetes  # noqa: F401
    except ImportError as exc:
        raise UserInputError(
            [FieldError(exc.name or "cluster", "needs: pip install 'gpufleet[cluster]'")]
        ) from exc


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
    for key_, value_ in nodes.labels:  # a topology level without a value: spread over two
        labels[key_] = value_ or f"{key_.rsplit('/', 1)[-1]}-{index % 2}"
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
        self._state_lock = threading.Lock()

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig users point KUBECONFIG at."""
        return self.dir / "kubeconfig"

    def up(
        self,
        nodes: NodeSpec | list[NodeSpec],
        *,
        timeout: float = 120,
        without: tuple[str, ...] = (),
        fair_sharing: bool = False,
        pod_delay_ms: int | None = None,
    ) -> State:
        """Start every component in order, each once the one before is ready; create the nodes.
        ``without`` names controllers (addons.PROJECTS) to leave out, as on a cluster that lacks
        them; ``fair_sharing`` turns on Kueue's fair sharing; ``pod_delay_ms`` caps kwok's delays at
        each step of a pod's life (capped_pod_stages). A running cluster in the same
        directory is found and returned as it is."""
        unknown = sorted(set(without) - set(addons.PROJECTS))
        if unknown:
            raise UserInputError([FieldError("--without", (
                f"unknown controller {', '.join(unknown)}; "
                f"one of: {', '.join(addons.PROJECTS)}"))])  # fmt: skip
        pools = nodes if isinstance(nodes, list) else [nodes]
        require_extra()
        running = self.state_if_running()
        if running is not None:
            self.log(f"already running: {running.server}")
            return running
        self.down(quiet=True)
        for addon in addons.ADDONS:  # before anything starts: fail fast, leave nothing behind
            if addon.project_name in without:
                continue
            lacking = [r for r in addon.requires if r in without]
            if lacking:
                raise UserInputError([FieldError("--without", (
                    f"{addon.name} needs {', '.join(lacking)}; leave {addon.name} out too "
                    f"(--without {addon.name})"))])  # fmt: skip
            busy = [p for p in addon.fixed_ports if not port_free(p)]
            if busy:
                raise ClusterUpError(
                    f"{addon.name} always listens on port {', '.join(map(str, busy))} (fixed in "
                    "its source), which another program (another local cluster?) holds; stop it "
                    f"or leave the controller out: --without {addon.name}"
                )
        binaries = ensure_built(self.log)
        pki = make_pki(self.dir / "pki")
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        names = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager",
                 "kube-scheduler"]  # fmt: skip
        names += [
            f"{a.name}-{use}" for a in addons.ADDONS for use in ("webhook", "health", "metrics")
        ]
        # All held at once while chosen: one port never goes to two listeners.
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        state = State(ports=ports, server=server, binaries=str(binaries))
        configs = {u: kubeconfig(self.dir / f"{u}.kubeconfig", server, pki, u)
                   for u in ("kube-controller-manager", "kube-scheduler", "kwok")}  # fmt: skip
        kubeconfig(self.kubeconfig, server, pki, "admin")
        kwok_stages = binaries / "kwok-stages"
        if pod_delay_ms is not None:
            kwok_stages = capped_pod_stages(kwok_stages, self.dir / "stages" / "kwok", pod_delay_ms)
        stages = sorted(kwok_stages.glob("*.yaml")) + sorted(STAGES.glob("*.yaml"))
        stages.append(owner_complete_stage(kwok_stages, self.dir / "stages"))
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
                binaries / "kwok",
                configs["kwok"],
                stages,
                lambda: self._nodes_ready(sum(p.count for p in pools)),
            ),
        ]
        try:
            for component in plan:
                if component.name == "kwok":
                    self._create_nodes(pools)
                self._start(component, state, timeout)
            enabled = [a for a in addons.ADDONS if a.project_name not in without]

            def start(addon: addons.Addon) -> None:
                extra: dict[str, Any] = {}
                if addon is addons.KUEUE:
                    sharing = addons.KUEUE_FAIR_SHARING if fair_sharing else {}
                    extra = addons.KUEUE_METRICS | sharing
                self._start_addon(addon, binaries, pki, server, state, timeout, extra, enabled)

            # The controllers start side by side (each mostly waits: on its CRDs, certificates,
            # readiness), in two waves: first those that install manifests and need no other
            # controller, then the rest (the Trainer needs JobSet's kinds, Volcano's controllers
            # and scheduler its CRDs).
            first = [a for a in enabled if a.manifest_name and not a.requires]
            for wave in (first, [a for a in enabled if a not in first]):
                with ThreadPoolExecutor(max_workers=max(1, len(wave))) as pool:
                    for done in [pool.submit(start, a) for a in wave]:
                        done.result()  # the first failure, once every start has ended
            self._install_other_crds(binaries, timeout)
        except BaseException:
            state.write(self.dir)
            self.down(quiet=True)
            raise
        state.write(self.dir)
        return state

    def _start(self, component: Component, state: State, timeout: float, restarts: int = 0) -> None:
        """Run ``component`` and wait until it is ready. ``restarts``: how often it is started
        again when it exits before that, as the kubelet restarts a pod's container (a manager
        whose webhook server starts before its own certificate rotation has filled the Secret
        exits once, in a cluster too)."""
        started = time.monotonic()
        log_path = self.dir / "logs" / f"{component.name}.log"

        def launch() -> subprocess.Popen[bytes]:
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(
                    component.argv,
                    env={**os.environ, **dict(component.env)} if component.env else None,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives `gpufleet cluster up`; `down` ends it
                )
            with self._state_lock:  # controllers start from several threads
                state.pids[component.name] = proc.pid
                state.write(self.dir)
            return proc

        proc = launch()
        while not component.ready():
            if proc.poll() is not None:
                if restarts > 0:
                    restarts -= 1
                    self.log(f"  {component.name} exited with {proc.returncode} while starting; "
                             "started again (as the kubelet would)")  # fmt: skip
                    proc = launch()
                    continue
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

    def _start_addon(
        self, addon: addons.Addon, binaries: Path, pki: Pki, server: str, state: State,
        timeout: float, extra: dict[str, Any], running: list[addons.Addon],
    ) -> None:  # fmt: skip
        """Install the addon's manifests, wait for its CRDs, run its manager, then prove its
        webhooks answer through the API server. Kueue gets the integrations of the controllers
        in ``running``."""
        docs = addons.load_manifests(manifests(binaries, addon))
        if addon is addons.KUEUE:
            extra = {**extra, **addons.kueue_frameworks(docs, running)}
        p = addons.Ports(
            *(state.ports[f"{addon.name}-{u}"] for u in ("webhook", "health", "metrics"))
        )
        config = addons.prepare(addon, pki, self.dir, docs, p, extra)
        if addon.config_files:
            addons.write_config_files(addon, docs, self.dir)
        if addon.manifest_name:  # the project's first process installs its manifests
            objects = addons.cluster_objects(addon, docs, pki.ca.read_bytes(), p.webhook)
            self._create_all(objects)
            self._wait(lambda: self._crds_established(list(addons.crd_names(objects))),
                       f"{addon.name}'s CRDs Established", timeout)  # fmt: skip
        kc = kubeconfig(self.dir / f"{addon.name}.kubeconfig", server, pki, addon.name)
        manager = controller_runtime_manager(
            addon.name,
            addons.argv(addon, binaries / addon.name, config, kc, p, self.dir, pki.ca),
            p.health,
            addons.environment(addon, self.dir, kc),
            path=addon.ready_path,
            tls=addon.ready_tls,
        )
        if addon.ready_lease:
            lease = addon.ready_lease
            held = lambda: self._lease_held(addon.namespace, lease)  # noqa: E731
            manager = Component(manager.name, manager.argv, held, manager.env)
        if addon.cert_secret:  # mount the Secret its rotation writes, then wait for /readyz
            ready, secret = manager.ready, addon.cert_secret
            certs = addons.cert_dir(addon, self.dir)
            fixed = addons.FIXED_CERT_CHECK if addon.tmpdir_certs else None
            if fixed is not None:  # a previous cluster's would open the gate before ours exist
                fixed.unlink(missing_ok=True)
            manager = Component(
                manager.name,
                manager.argv,
                lambda: self._mount_secret(addon.namespace, secret, certs, fixed) and ready(),
                manager.env,
            )
        self._start(manager, state, timeout, restarts=ADDON_RESTARTS)
        if addon.probe is not None:
            probe = addon.probe
            self._wait(lambda: self._dry_run(probe), f"{addon.name}'s webhooks", timeout)
        if addon.after_ready:
            own = addons.load_manifests(binaries / "manifests" / f"{addon.after_ready}.yaml")
            self._create_custom(own)
            self.log(f"  {len(own)} {addon.after_ready} applied")

    def _lease_held(self, namespace: str, name: str) -> bool:
        from kubernetes import client

        from gpufleet.cluster.client import api_errors

        try:
            lease = client.CoordinationV1Api(self._api()).read_namespaced_lease(name, namespace)
        except api_errors():
            return False
        return bool(lease.spec and lease.spec.holder_identity)

    def _install_other_crds(self, binaries: Path, timeout: float) -> None:
        """The CRDs of projects a cluster of the chart's design has but that do not run here
        (Prometheus Operator, Volcano, KEDA, KServe: controlplane/crds.txt), from their
        modules."""
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self._api())
        served = {c.metadata.name for c in ext.list_custom_resource_definition().items
                  if c.metadata}  # fmt: skip
        docs = [d for f in sorted((binaries / "crds").glob("*.yaml"))
                for d in addons.load_manifests(f)]  # fmt: skip
        # Those a running controller installed already (Volcano's, when it runs) stay its own.
        self._create_all([d for d in docs if d["metadata"]["name"] not in served])
        self._wait(lambda: self._crds_established(list(addons.crd_names(docs))),
                   f"{len(docs)} CRDs of other projects Established", timeout)  # fmt: skip

    def _api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def _create_all(self, objects: list[dict[str, Any]]) -> None:
        from kubernetes import utils

        api = self._api()
        for obj in objects:
            utils.create_from_dict(api, obj)

    def _create_custom(self, objects: list[dict[str, Any]], dry_run: str | None = None) -> None:
        """Create objects of custom kinds (the Trainer's runtimes, webhook probes)."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self._api())
        for obj in objects:
            group, version = obj["apiVersion"].split("/")
            plural = obj["kind"].lower() + "s"
            ns = obj["metadata"].get("namespace")
            if ns:
                custom.create_namespaced_custom_object(
                    group, version, ns, plural, obj, dry_run=dry_run
                )
            else:
                custom.create_cluster_custom_object(group, version, plural, obj, dry_run=dry_run)

    def _mount_secret(
        self, namespace: str, name: str, directory: Path, fixed: Path | None = None
    ) -> bool:
        """The kubelet's part for a manager outside a pod: once its Secret holds a serving
        certificate, put it where the manager reads it (and at ``fixed``, a path the manager
        only checks exists). False until then."""
        import base64

        from gpufleet.cluster.client import api_errors

        if (directory / "tls.crt").exists():
            if fixed is not None and not fixed.exists():
                fixed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(directory / "tls.crt", fixed)
            return True
        try:
            data = self._core().read_namespaced_secret(name, namespace).data or {}
        except api_errors():
            return False
        if not data.get("tls.crt") or not data.get("tls.key"):
            return False
        addons.write_certs(
            directory, base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])
        )
        return True

    def _crds_established(self, names: list[str]) -> bool:
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self._api())
        for name in names:
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    def _dry_run(self, obj: dict[str, Any]) -> bool:
        """Create ``obj`` with dryRun=All; False while a webhook cannot be called."""
        from gpufleet.cluster.client import api_errors

        try:
            self._create_custom([obj], dry_run="All")
        except api_errors():
            return False
        return True

    def _wait(self, check: Callable[[], bool], what: str, timeout: float) -> None:
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                raise ClusterUpError(f"{what}: not ready after {timeout:g} s")
            time.sleep(0.2)
        self.log(f"  {what} ready ({time.monotonic() - started:.1f} s)")

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api())

    def _create_nodes(self, pools: list[NodeSpec]) -> None:
        core = self._core()
        for pool in pools:
            for i in range(pool.count):
                core.create_node(node_object(f"{pool.prefix}-{i}", pool, i))
        if any(
            pool.gpus for pool in pools
        ):  # what the NVIDIA GPU Operator installs; GPU pods may name it
            self._create_all([NVIDIA_RUNTIME_CLASS])

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
        if state is None or not set(BASE) <= set(state.pids):
            return None
        return state if all(state.alive(name) for name in state.pids) else None

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
