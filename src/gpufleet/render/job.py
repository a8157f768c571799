"""Target ``job``: an Indexed batch/v1 Job plus a headless Service. Runs on any cluster."""

from __future__ import annotations

from gpufleet.kube import (
    ANNOTATION_NODE_RANGE,
    KUEUE_ELASTIC_JOB,
    LABEL_JOB,
    LABEL_ROLE,
    ROLE_WORKER,
    Obj,
)
from gpufleet.render.checks import require_cluster_ready
from gpufleet.render.jobparts import indexed_job_spec, queued_labels, tf_workers
from gpufleet.render.meta import labels, metadata
from gpufleet.render.podspec import RDZV_PORT, WorkerPod, nnodes, pod_spec
from gpufleet.spec import TrainingJob

# How long torchrun's rendezvous waits for more nodes once minNodes joined (torch: 30 s). An
# elastic job on Kueue runs exactly the pods of its admitted size, all created at once: a pod
# later than this joins with a membership change, which at the start costs nothing trained.
ELASTIC_LAST_CALL_S = 5


def render_indexed_job(job: TrainingJob) -> list[Obj]:
    """The Service and the Indexed Job for ``job`` (raises UserInputError if it cannot run).

    Pod i is ``<name>-i`` in the headless Service ``<name>``; pod 0 hosts the c10d rendezvous.
    Worker crashes restart inside the pod (torchrun --max-restarts); a failed pod is retried up
    to ``spec.maxRestarts`` times (backoffLimit), and neither a preemption ("preempted" exit
    code after its checkpoint) nor a disruption (node drain, Kueue preemption) counts.

    Queued with a node range (spec.minNodes), it is one of Kueue's elastic jobs: rendered at
    spec.nodes, resized within the range by gpufleet's elastic controller (``elastic``).
    """
    require_cluster_ready(job, "job")
    name = job.metadata.name
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, labels(job, "trainer", "rendezvous")),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # DNS must work before pods are ready
            "selector": {LABEL_JOB: name, LABEL_ROLE: ROLE_WORKER},
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}],
        },
    }
    hosts = [f"{name}-{i}.{name}" for i in range(job.spec.nodes)]
    conf = f"last_call_timeout={ELASTIC_LAST_CALL_S}" if elastic(job) else ""
    pod = pod_spec(job, WorkerPod(rdzv_host=hosts[0], env=tf_workers(job, hosts), rdzv_conf=conf))
    pod["subdomain"] = name
    spec = indexed_job_spec(job, pod, backoff_limit=job.spec.max_restarts, on_preempted="Ignore")
    if job.spec.queue:
        spec["suspend"] = True  # Kueue admits (unsuspends) it when quota allows
    indexed: Obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, queued_labels(job)),
        "spec": spec,
    }
    if elastic(job):
        indexed["metadata"]["annotations"] = {
            KUEUE_ELASTIC_JOB: "true",
            ANNOTATION_NODE_RANGE: nnodes(job),
        }
    return [service, indexed]


def elastic(job: TrainingJob) -> bool:
    """Whether ``job`` is one of Kueue's elastic jobs: queued, with a node range."""
    low = job.spec.min_nodes
    return bool(job.spec.queue) and low is not None and low != job.spec.nodes
