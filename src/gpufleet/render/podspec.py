"""The shared pod builder: one worker pod template, used by every Kubernetes target.

Everything a target renders about a worker pod comes from here (image, torchrun command, env,
resources, GPU and node-loss tolerations, volumes, the restricted security context, its
metadata), so targets only add their own wrapper (Indexed Job, JobSet, PyTorchJob, ...).
Labels and ObjectMeta are in ``render.meta``, the cluster-readiness check in ``render.checks``,
what several job targets share in ``render.jobparts``, the PodMonitor in
``render.monitoring``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from gpufleet.kube import (
    KUEUE_PREFERRED_TOPOLOGY,
    KUEUE_REQUIRED_TOPOLOGY,
    LABEL_MONITOR,
    METRICS_PORT_NAME,
    MONITOR_OWN,
    MULTUS_NETWORKS,
    ROLE_WORKER,
    Obj,
)
from gpufleet.launch.pod import MODULE as POD_LAUNCHER
from gpufleet.launch.worker import worker_env as any_worker_env
from gpufleet.launch.worker import worker_module_args
from gpufleet.observe.tls import CERT_FILE as TLS_CERT
from gpufleet.observe.tls import KEY_FILE as TLS_KEY
from gpufleet.render.meta import labels
from gpufleet.render.podsecurity import RDMA_CAPABILITY
from gpufleet.spec import Rdma, Resources, TrainingJob
from gpufleet.torchapi import ENV_SHUTDOWN_TIMEOUT

RDZV_PORT = 29400
RUN_DIR = "/run/gpufleet"
# Where a worker pod mounts the Secrets gpufleet reads as files (<root>/<name>/<key>): the
# durable tier's key (spec.checkpoint.durable.encryption.keySecret), never an env variable.
SECRETS_ROOT = "/var/run/secrets/gpufleet"
UID = 1000  # the non-root user the worker image runs as
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
# Pod Security "restricted", container and pod level (see podsecurity.py for the check).
CONTAINER_SECURITY: Obj = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}
POD_SECURITY: Obj = {
    "runAsNonRoot": True,
    "runAsUser": UID,
    "runAsGroup": UID,
    "fsGroup": UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass(frozen=True, kw_only=True)
class WorkerPod:
    """What a target decides about its pods; the pod builder fills in the rest."""

    # Stable DNS name of the pod that hosts the c10d rendezvous store. With c10d, node ranks
    # come from the rendezvous, so a pod that is replaced rejoins without knowing its index.
    rdzv_host: str
    # Some operators look for a container of their own name ("pytorch" for PyTorchJob).
    container_name: str = "worker"
    # The container's command, when a target starts torchrun some other way (MPI workers run
    # sshd and the launcher's mpirun starts torchrun over ssh). Default: torchrun_command().
    command: list[str] | None = None
    # False for pods that only coordinate (the MPI launcher): no GPUs, no data volumes.
    worker: bool = True
    # Variables the target adds to every worker's (a TensorFlow job's worker addresses).
    env: tuple[tuple[str, str], ...] = ()
    # torchrun's --rdzv-conf, where the target sets one (a Kueue elastic job's last call).
    rdzv_conf: str = ""


def scrape_annotations(port: int, *, tls: bool = False) -> dict[str, str]:
    """Prometheus' scrape annotations for a pod serving /metrics on ``port`` (HTTPS: ``tls``)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        **({"prometheus.io/scheme": "https"} if tls else {}),
    }


def pod_metadata(job: TrainingJob, role: str) -> Obj:
    """A pod template's metadata: labels; on workers, Prometheus' scrape annotations when
    they serve the job's metrics (the launcher of each worker pod, on spec.metrics.port) and
    Kueue's topology request (spec.topology: the workers' collectives want one domain)."""
    meta: Obj = {"labels": labels(job, "trainer", role)}
    annotations: dict[str, str] = {}
    if job.spec.metrics.port and role == ROLE_WORKER:
        annotations |= scrape_annotations(job.spec.metrics.port, tls=bool(job.spec.metrics.tls))
        if job.spec.metrics.pod_monitor or job.spec.metrics.tls:  # the chart's PodMonitor
            meta["labels"][LABEL_MONITOR] = MONITOR_OWN  # scrapes plain HTTP: not these
    topology = job.spec.topology
    if topology is not None and role == ROLE_WORKER:
        key = KUEUE_REQUIRED_TOPOLOGY if topology.required else KUEUE_PREFERRED_TOPOLOGY
        annotations[key] = topology.level
    if job.spec.rdma is not None and role == ROLE_WORKER:
        annotations[MULTUS_NETWORKS] = job.spec.rdma.network
    if annotations:
        meta["annotations"] = annotations
    return meta


def resource_quantities(r: Resources) -> dict[str, str]:
    """Requests (= limits) of a container: CPU, memory and GPUs, those the spec sets."""
    out = {k: v for k, v in (("cpu", r.cpu), ("memory", r.memory)) if v}
    if r.gpu:
        out[GPU_RESOURCE] = str(r.gpu)
    return out


def gpu_placement(r: Resources) -> Obj:
    """PodSpec fields for GPU pods: the GPU taint's toleration and the product selector."""
    if not r.gpu:
        return {}
    out: Obj = {
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    }
    if r.gpu_product:
        out["nodeSelector"] = {GPU_PRODUCT_LABEL: r.gpu_product}
    return out


# The taints the node controller puts on a node that stops reporting (NoExecute).
NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def node_loss_tolerations(job: TrainingJob) -> list[Obj]:
    """How long a pod stays on a lost node before it is evicted (spec.nodeLossTimeout). The
    API server's DefaultTolerationSeconds admission would otherwise add these with 300 s."""
    seconds = math.ceil(job.spec.node_loss_timeout)
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in NODE_LOSS_TAINTS]  # fmt: skip


def nnodes(job: TrainingJob) -> str:
    """torchrun's ``--nnodes``: ``N``, or ``MIN:MAX`` for an elastic range (spec.minNodes)."""
    s = job.spec
    low = s.min_nodes
    return f"{low}:{s.nodes}" if low is not None and low != s.nodes else str(s.nodes)


def torchrun_command(job: TrainingJob, where: WorkerPod) -> list[str]:
    """``python -m torch.distributed.run`` with c10d rendezvous, then the worker entry point."""
    s = job.spec
    cmd = [
        "python",
        "-m",
        POD_LAUNCHER,  # torchrun, plus job metrics and gpufleet's exit codes
        f"--nnodes={nnodes(job)}",
        f"--nproc-per-node={s.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={where.rdzv_host}:{RDZV_PORT}",
        f"--rdzv-id={job.metadata.name}",
        f"--max-restarts={s.max_restarts}",
        *([f"--rdzv-conf={where.rdzv_conf}"] if where.rdzv_conf else []),
    ]
    return [*cmd, *worker_module_args(job)]


def worker_env(job: TrainingJob) -> dict[str, str]:
    """The environment of every worker pod's workers: gpufleet.launch.worker.worker_env (the
    same as ``gpufleet run``'s) for the pod's run directory, job metrics served on all the
    pod's addresses, and torchrun's wait for its workers after SIGTERM (spec.preemption
    .gracePeriod; as an environment variable, which a torch before 2.12 ignores where it would
    fail on a flag it does not know: gpufleet.torchapi)."""
    assert job.spec.checkpoint.dir or job.spec.checkpoint.durable, "call require_cluster_ready"
    env = any_worker_env(job, Path(RUN_DIR), metrics_address="0.0.0.0", secrets_root=SECRETS_ROOT)
    return {**env, ENV_SHUTDOWN_TIMEOUT: str(math.ceil(job.spec.preemption.grace_period))}


def container_env(job: TrainingJob) -> list[Obj]:
    """The container's env: plain values, and Secret/ConfigMap references as valueFrom (the
    kubelet resolves them; their values never appear in a rendered object)."""
    env: list[Obj] = [{"name": k, "value": v} for k, v in worker_env(job).items()]
    for name, source in job.spec.env_refs.items():
        kind, ref = source.ref
        key_ref: Obj = {"name": ref.name, "key": ref.key}
        if ref.optional:
            key_ref["optional"] = True
        env.append({"name": name, "valueFrom": {kind: key_ref}})
    return sorted(env, key=lambda e: e["name"])


def container_env_from(job: TrainingJob) -> list[Obj]:
    """The container's envFrom: whole Secrets and ConfigMaps, as the spec lists them."""
    out = []
    for source in job.spec.env_from:
        kind, ref = source.ref
        item: Obj = {kind: {"name": ref.name, **({"optional": True} if ref.optional else {})}}
        if source.prefix:
            item["prefix"] = source.prefix
        out.append(item)
    return out


def _read_only(flag: bool) -> Obj:
    """``readOnly`` only when true, as Kubernetes' own types write it: a controller that
    round-trips the object drops ``readOnly: false``, and Kubeflow Trainer's CEL rule (a
    runtime patch's volumes and containers are immutable) then refused Kueue's update of every
    TrainJob, which never started."""
    return {"readOnly": True} if flag else {}


def _attach_rdma(container: Obj, rdma: Rdma) -> None:
    """A worker on the InfiniBand network (its Multus annotation: pod_metadata): one RDMA
    device, IPC_LOCK to pin the memory it registers (restricted's one exception, which the
    chart's rdma tenants allow), NCCL on those adapters and bootstrapping over the pods' own
    interface."""
    requests = container["resources"].setdefault("requests", {})
    requests[rdma.resource] = "1"
    container["resources"]["limits"] = dict(requests)
    container["securityContext"]["capabilities"]["add"] = [RDMA_CAPABILITY]
    have = {e["name"] for e in container["env"]}  # the spec's own env wins, as everywhere
    nccl = [{"name": n, "value": v}
            for n, v in (("NCCL_IB_HCA", rdma.hca), ("NCCL_SOCKET_IFNAME", rdma.socket_ifname))
            if n not in have]  # fmt: skip
    container["env"] = sorted(container["env"] + nccl, key=lambda e: e["name"])


def _mount_secrets(job: TrainingJob, mounts: list[Obj], volumes: list[Obj]) -> None:
    """The Secrets gpufleet reads as files, mounted read-only at <SECRETS_ROOT>/<name>,
    readable by the pod's group only (fsGroup): the durable tier's key (spec.checkpoint
    .durable.encryption.keySecret, its one key) and the metrics' TLS Secret (spec.metrics.tls:
    tls.crt and tls.key)."""
    durable, tls = job.spec.checkpoint.durable, job.spec.metrics.tls
    ref = durable.encryption.key_secret if durable and durable.encryption else None
    wanted: list[tuple[str, str, list[str]]] = []
    if ref is not None:
        wanted.append(("checkpoint-key", ref.name, [ref.key]))
    if tls is not None:
        wanted.append(("metrics-tls", tls.secret_name, [TLS_CERT, TLS_KEY]))
    for volume, secret, keys in wanted:
        volumes.append({"name": volume, "secret": {
            "secretName": secret, "items": [{"key": k, "path": k} for k in keys],
            "defaultMode": 0o440}})  # fmt: skip
        mounts.append({"name": volume, "mountPath": f"{SECRETS_ROOT}/{secret}", "readOnly": True})


def pod_spec(job: TrainingJob, where: WorkerPod) -> Obj:
    """A PodSpec for ``job``: passes the Pod Security "restricted" profile by construction."""
    s = job.spec
    assert s.image, "call require_cluster_ready first"
    resources = resource_quantities(s.resources) if where.worker else {}
    data = s.volumes if where.worker else []
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "run", "mountPath": RUN_DIR},
    ] + [{"name": v.name, "mountPath": v.mount_path, **_read_only(v.read_only)} for v in data]
    volumes: list[Obj] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "run", "emptyDir": {}},
    ] + [
        {
            "name": v.name,
            "persistentVolumeClaim": {"claimName": v.claim_name, **_read_only(v.read_only)},
        }
        for v in data
    ]
    container: Obj = {
        "name": where.container_name,
        "image": s.image,
        "imagePullPolicy": "IfNotPresent",
        # A container that fails keeps its log's last lines as its termination message, which
        # `gpufleet status` reads (an image without gpufleet: cluster/imagecheck.py).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "command": where.command or torchrun_command(job, where),
        "env": sorted(
            container_env(job) + [{"name": k, "value": v} for k, v in where.env],
            key=lambda e: e["name"],
        ),
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT}]
        + (
            [{"name": METRICS_PORT_NAME, "containerPort": s.metrics.port}]
            if s.metrics.port and where.worker
            else []
        ),
        **({"envFrom": container_env_from(job)} if job.spec.env_from else {}),
        "resources": {"requests": resources, "limits": resources} if resources else {},
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    _mount_secrets(job, mounts, volumes)
    spec: Obj = {
        "restartPolicy": "Never",
        # The preemption checkpoint must fit in the grace period the kubelet gives.
        "terminationGracePeriodSeconds": math.ceil(s.preemption.grace_period),
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
    }
    if where.worker:
        spec.update(gpu_placement(s.resources))
        if s.rdma is not None:
            _attach_rdma(container, s.rdma)
    spec["tolerations"] = [*spec.get("tolerations", []), *node_loss_tolerations(job)]
    return spec
