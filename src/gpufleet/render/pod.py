"""The shared pod builder: one worker pod template, used by every Kubernetes target.

Everything a target renders about a worker comes from here (image, torchrun command, env,
resources, GPU tolerations, volumes, the restricted security context, labels), so targets only
add their own wrapper (Indexed Job, JobSet, PyTorchJob, ...).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import EXIT_PREEMPTED, FieldError, UserInputError
from gpufleet.kube import (
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    LABEL_JOB,
    LABEL_QUEUE,
    LABEL_ROLE,
    LABEL_TENANT,
    ROLE_WORKER,
    Obj,
)
from gpufleet.launch.pod import ENV_METRICS_ADDRESS, ENV_METRICS_PORT
from gpufleet.launch.pod import MODULE as POD_LAUNCHER
from gpufleet.launch.worker import job_context, worker_module_args
from gpufleet.spec.inference import InferenceService
from gpufleet.spec.models import Metadata, Resources, TrainingJob

RDZV_PORT = 29400
METRICS_PORT_NAME = "metrics"
RUN_DIR = "/run/gpufleet"
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


def cluster_errors(job: TrainingJob) -> list[FieldError]:
    """Why ``job`` cannot run on Kubernetes (empty: it can)."""
    s = job.spec
    errors = []
    if not s.image:
        errors.append(FieldError("spec.image", "required on Kubernetes: the container image"))
    ckpt = s.checkpoint.dir
    mounts = [v.mount_path for v in s.volumes]
    if not ckpt:
        errors.append(
            FieldError(
                "spec.checkpoint.dir",
                "required on Kubernetes, or checkpoints die with the pod: a path under one of "
                "spec.volumes[*].mountPath, or an fsspec URI such as s3://bucket/path",
            )
        )
    elif "://" not in ckpt and not any(_is_under(ckpt, m) for m in mounts):
        errors.append(
            FieldError(
                "spec.checkpoint.dir",
                f"{ckpt} is not on a volume; mount one (spec.volumes) at a parent directory "
                "or use an fsspec URI",
            )
        )
    gpu = s.resources.gpu
    if gpu and gpu % s.procs_per_node:
        errors.append(
            FieldError(
                "spec.resources.gpu",
                f"{gpu} GPUs per node cannot be divided among {s.procs_per_node} processes",
            )
        )
    return errors


def require_cluster_ready(job: TrainingJob) -> None:
    """Raise UserInputError (exit 2) listing every reason ``job`` cannot run on Kubernetes."""
    errors = cluster_errors(job)
    if errors:
        raise UserInputError(errors)


def standard_labels(
    meta: Metadata, component: str, role: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The labels of every object gpufleet renders, for jobs and services alike: the GPU
    exporter attributes GPUs by gpufleet.dev/job and tenant."""
    return {
        "app.kubernetes.io/name": "gpufleet",
        "app.kubernetes.io/instance": meta.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "gpufleet",
        "app.kubernetes.io/managed-by": "gpufleet",
        LABEL_JOB: meta.name,
        LABEL_TENANT: meta.namespace or "default",
        LABEL_ROLE: role,
        **(extra or {}),
        **meta.labels,
    }


def labels(job: TrainingJob, component: str, role: str) -> dict[str, str]:
    """The standard labels of every object a job renders."""
    # The queue label lets the GPU exporter attribute usage to queues (Kueue labels only the job).
    queue = {LABEL_QUEUE: job.spec.queue} if job.spec.queue else {}
    return standard_labels(job.metadata, component, role, queue)


def scrape_annotations(port: int) -> dict[str, str]:
    """Prometheus' scrape annotations for a pod serving /metrics on ``port``."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }


def pod_metadata(job: TrainingJob, role: str) -> Obj:
    """A pod template's metadata: labels, and Prometheus' scrape annotations on pods that
    serve the job's metrics (the launcher of each worker pod, on spec.metrics.port)."""
    meta: Obj = {"labels": labels(job, "trainer", role)}
    if job.spec.metrics.port and role == ROLE_WORKER:
        meta["annotations"] = scrape_annotations(job.spec.metrics.port)
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


def pod_monitor(job: TrainingJob) -> list[Obj]:
    """A PodMonitor for the job's worker pods when the spec asks for one (else nothing)."""
    if not job.spec.metrics.pod_monitor:
        return []
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": metadata(job, labels(job, "trainer", "metrics")),
            "spec": {
                "selector": {
                    "matchLabels": {LABEL_JOB: job.metadata.name, LABEL_ROLE: ROLE_WORKER}
                },
                "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics"}],
            },
        }
    ]


def torchrun_command(job: TrainingJob, where: WorkerPod) -> list[str]:
    """``python -m torch.distributed.run`` with c10d rendezvous, then the worker entry point."""
    s = job.spec
    cmd = [
        "python",
        "-m",
        POD_LAUNCHER,  # torchrun, plus job metrics and gpufleet's exit codes
        f"--shutdown-timeout={math.ceil(s.preemption.grace_period)}",
        f"--nnodes={s.nodes}",
        f"--nproc-per-node={s.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={where.rdzv_host}:{RDZV_PORT}",
        f"--rdzv-id={job.metadata.name}",
        f"--max-restarts={s.max_restarts}",
    ]
    return [*cmd, *worker_module_args(job)]


def worker_env(job: TrainingJob) -> dict[str, str]:
    """The environment of every worker: torch threads, GPUFLEET_* context, the spec's env."""
    assert job.spec.checkpoint.dir, "call require_cluster_ready first"
    context = job_context(job, Path(RUN_DIR), f"{RUN_DIR}/metrics")
    env = {"OMP_NUM_THREADS": "1", **context.to_env()}
    if job.spec.metrics.port:  # served by the pod's launcher, for Prometheus outside the pod
        env[ENV_METRICS_PORT] = str(job.spec.metrics.port)
        env[ENV_METRICS_ADDRESS] = "0.0.0.0"
    return {**env, **job.spec.env}


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
    ] + [{"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only} for v in data]
    volumes: list[Obj] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "run", "emptyDir": {}},
    ] + [
        {
            "name": v.name,
            "persistentVolumeClaim": {"claimName": v.claim_name, "readOnly": v.read_only},
        }
        for v in data
    ]
    container: Obj = {
        "name": where.container_name,
        "image": s.image,
        "imagePullPolicy": "IfNotPresent",
        "command": where.command or torchrun_command(job, where),
        "env": [{"name": k, "value": v} for k, v in sorted(worker_env(job).items())],
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT}]
        + (
            [{"name": METRICS_PORT_NAME, "containerPort": s.metrics.port}]
            if s.metrics.port and where.worker
            else []
        ),
        "resources": {"requests": resources, "limits": resources} if resources else {},
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
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
    return spec


def metadata(job: TrainingJob | InferenceService, obj_labels: dict[str, str]) -> Obj:
    """ObjectMeta of a top-level object: the spec's name, namespace (if any) and labels."""
    meta: Obj = {"name": job.metadata.name}
    if job.metadata.namespace:
        meta["namespace"] = job.metadata.namespace
    meta["labels"] = obj_labels
    return meta


def queued_labels(job: TrainingJob) -> dict[str, str]:
    """Labels of the object Kueue admits: the worker labels plus queue and priority class."""
    out = labels(job, "trainer", "worker")
    if job.spec.queue:
        out[KUEUE_QUEUE_LABEL] = job.spec.queue
    if job.spec.priority:
        out[KUEUE_PRIORITY_LABEL] = job.spec.priority
    return out


def kubeflow_run_policy(job: TrainingJob, clean_pod_policy: str) -> Obj:
    """The runPolicy of Kubeflow jobs (PyTorchJob, MPIJob): the restart budget, and suspended
    for Kueue when the spec names a queue (Kueue admits, i.e. unsuspends, it)."""
    policy: Obj = {"backoffLimit": job.spec.max_restarts, "cleanPodPolicy": clean_pod_policy}
    if job.spec.queue:
        policy["suspend"] = True
    return policy


def indexed_job_spec(job: TrainingJob, pod: Obj, *, backoff_limit: int, on_preempted: str) -> Obj:
    """An Indexed JobSpec with one pod per node; ``on_preempted`` is the pod failure policy's
    action for the "preempted" exit code (Ignore: retry free; FailJob: let the parent decide).
    Disruptions (node drain, Kueue preemption) never count against the restart budget."""
    return {
        "completionMode": "Indexed",
        "completions": job.spec.nodes,
        "parallelism": job.spec.nodes,
        "backoffLimit": backoff_limit,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": on_preempted,
                    "onExitCodes": {"operator": "In", "values": [EXIT_PREEMPTED]},
                },
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
            ]
        },
        "template": {"metadata": pod_metadata(job, "worker"), "spec": pod},
    }


def _is_under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")
