"""The Kubernetes vocabulary every part of gpufleet shares: the object type the renderers build
and the cluster client reads, and the label keys gpufleet writes and later selects by.

Pure names, no imports of the kubernetes client: the renderers, the cluster client, the status
folding and the GPU exporter all use them, and a label written by one and read by another must
be the same string (TorchX keeps its pod labels as LABEL_* constants for the same reason).
"""

from __future__ import annotations

from typing import Any

# A Kubernetes object as the API's camelCase JSON: what renderers return and clients send.
Obj = dict[str, Any]

LABEL_JOB = "gpufleet.dev/job"  # the job's or service's name: selectors, GPU attribution
LABEL_TENANT = "gpufleet.dev/tenant"  # the namespace it was rendered for
LABEL_ROLE = "gpufleet.dev/role"  # ROLE_* below
LABEL_QUEUE = "gpufleet.dev/queue"  # the Kueue LocalQueue, on pods (Kueue labels only the job)
# On pods scraped by their job's own PodMonitor (spec.metrics.podMonitor): the chart's
# PodMonitor leaves them out, so no pod is scraped twice.
LABEL_MONITOR = "gpufleet.dev/monitor"
MONITOR_OWN = "own"
ROLE_WORKER = "worker"
# The container port a training pod serves its job metrics on (PodMonitor, `status`).
METRICS_PORT_NAME = "metrics"
ROLE_SERVER = "server"

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's topology-aware scheduling, on a pod set's template: the level its pods must (or
# should) share a domain of.
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
# Kueue's elastic jobs (WorkloadSlices): a Job that carries it may change its parallelism while
# admitted; set at creation only (Kueue's webhook refuses adding or removing it).
KUEUE_ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"
# On an elastic Job: its node range "MIN:MAX" (spec.minNodes:spec.nodes), which the elastic
# controller keeps its size in, and the resizes it made (a JSON list: from, to, cause, at).
ANNOTATION_NODE_RANGE = "gpufleet.dev/node-range"
ANNOTATION_RESIZES = "gpufleet.dev/resizes"
# Multus: the secondary networks a pod is attached to (NetworkAttachmentDefinitions).
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
# The label of namespaces whose pods may add IPC_LOCK (RDMA): the chart's rdma tenants.
LABEL_RDMA = "gpufleet.dev/rdma"


def job_selector(name: str) -> str:
    """The label selector of everything gpufleet rendered for the job (or service) ``name``."""
    return f"{LABEL_JOB}={name}"
