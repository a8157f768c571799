"""``gpufleet logs`` once a job's pods are gone: the ranks' logs its pod launchers kept beside
the checkpoints (gpufleet.launch.keptlogs), printed by a short-lived reader pod.

The reader mounts what the job's worker pods mount and has their environment, so it reads a
PersistentVolumeClaim or an object store with the job's own credentials (which stay in the
cluster), under the same Pod Security "restricted" context the renderers give every pod. It
asks for no GPU and is deleted once its log is read.
"""

from __future__ import annotations

import copy
import secrets
import time
from typing import Any

from gpufleet.cluster.access import as_dict
from gpufleet.errors import ClusterError
from gpufleet.kube import Obj
from gpufleet.launch.keptlogs import MODULE
from gpufleet.render.podsecurity import pod_specs_in
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from gpufleet.runtime.context import ENV_CHECKPOINT_DIR, kept_logs_root

READER_TIMEOUT = 120.0  # seconds for the reader pod to be scheduled, start and finish
READER_RESOURCES = {"cpu": "100m", "memory": "256Mi"}
READER_LABEL = "gpufleet.dev/logs-of"  # on the reader pod: the job whose logs it reads


def _checkpoint_dir(container: Obj) -> str | None:
    """Where the container's launcher keeps its logs (gpufleet.runtime.context.kept_logs_root)."""
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    return kept_logs_root(env)


def _reaches(container: Obj, directory: str) -> bool:
    """Whether the container can read ``directory``: a URI, or a path under one of its mounts
    (an MPIJob's launcher has the job's environment but not its checkpoint volume)."""
    if "://" in directory:
        return True
    mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts") or []]
    return any(f"{directory.rstrip('/')}/".startswith(m) for m in mounts)


def worker_pod_spec(job: Obj) -> Obj | None:
    """The job's worker PodSpec as rendered: the first whose container has the checkpoint
    directory in its environment and mounted. A TrainJob's is split: its runtime patch's pod,
    with the trainer's image and environment."""
    trainer = (job.get("spec") or {}).get("trainer") or {}
    for _, spec in pod_specs_in(job):
        if trainer.get("image") and spec["containers"]:
            spec = copy.deepcopy(spec)
            spec["containers"][0].update(image=trainer["image"], env=trainer.get("env") or [])
        container = next((c for c in spec["containers"] if _checkpoint_dir(c)), None)
        if container is not None and _reaches(container, str(_checkpoint_dir(container))):
            return spec
    return None


def reader_pod(job: Obj, tail: int | None = None) -> Obj:
    """The pod that prints ``job``'s kept logs (with ``tail``, the last lines of each file);
    ClusterError when the job has no checkpoint directory to read (one gpufleet did not
    render). It goes where the job's pods may go (their node selector and affinity: nodes
    that have the image) and mounts their claims read-only."""
    name = job["metadata"]["name"]
    spec = worker_pod_spec(job)
    if spec is None:
        raise ClusterError(f"{name}: no worker pod with {ENV_CHECKPOINT_DIR}; no kept logs to read")
    worker = next(c for c in spec["containers"] if _checkpoint_dir(c))
    claims = {v["name"] for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v}
    mounts = [{**m, "readOnly": True} if m["name"] in claims else m
              for m in worker.get("volumeMounts") or []]  # fmt: skip
    container: Obj = {
        "name": "logs",
        "image": worker["image"],
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", MODULE, *(["--tail", str(tail)] if tail else [])],
        "env": worker.get("env") or [],
        **({"envFrom": worker["envFrom"]} if worker.get("envFrom") else {}),
        "resources": {"requests": READER_RESOURCES, "limits": READER_RESOURCES},
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-logs-{secrets.token_hex(3)}",
            "labels": {"app.kubernetes.io/managed-by": "gpufleet", READER_LABEL: name},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(READER_TIMEOUT),
            "securityContext": copy.deepcopy(POD_SECURITY),
            "containers": [container],
            "volumes": spec.get("volumes") or [],
            **{k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)},
        },
    }


def read_kept_logs(
    core: Any, namespace: str, job: Obj, *, tail: int | None = None, timeout: float = READER_TIMEOUT
) -> str:
    """Run the reader pod for ``job`` and return its log, the kept lines; the pod is deleted
    whatever happens. ClusterError when it failed (no logs kept: its last line says where it
    looked) or never finished."""
    pod = reader_pod(job, tail)
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(namespace, pod)
    try:
        deadline = time.monotonic() + timeout
        phase, why = "Pending", ""
        while time.monotonic() < deadline:
            status = as_dict(core.read_namespaced_pod(name, namespace)).get("status") or {}
            phase = status.get("phase") or "Pending"
            unmet = [c for c in status.get("conditions") or [] if c.get("status") == "False"]
            why = "; ".join(c.get("message") or c.get("reason") or "" for c in unmet)
            if phase == "Succeeded":
                return str(core.read_namespaced_pod_log(name, namespace))
            if phase == "Failed":
                said = str(core.read_namespaced_pod_log(name, namespace)).strip().splitlines()
                raise ClusterError(said[-1] if said else f"the reader pod {name} failed: "
                                   f"{status.get('reason') or status.get('message')}")  # fmt: skip
            time.sleep(0.5)
        raise ClusterError(f"the reader pod {name} did not finish in {timeout:.0f} s "
                           f"({phase}{': ' + why if why else ''})")  # fmt: skip
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
