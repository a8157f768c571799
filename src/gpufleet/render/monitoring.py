"""A Prometheus Operator PodMonitor for a job's worker pods (spec.metrics.podMonitor)."""

from __future__ import annotations

from gpufleet.kube import LABEL_JOB, LABEL_ROLE, METRICS_PORT_NAME, ROLE_WORKER, Obj
from gpufleet.observe.tls import CA_FILE
from gpufleet.render.meta import labels, metadata
from gpufleet.spec import TrainingJob


def pod_monitor(job: TrainingJob) -> list[Obj]:
    """A PodMonitor for the job's worker pods when the spec asks for one (else nothing)."""
    if not job.spec.metrics.pod_monitor:
        return []
    endpoint: Obj = {"port": METRICS_PORT_NAME, "path": "/metrics"}
    if (tls := job.spec.metrics.tls) is not None:  # trust the CA in the job's TLS Secret
        ca = {"secret": {"name": tls.secret_name, "key": CA_FILE}}
        server = {"serverName": tls.server_name} if tls.server_name else {}
        endpoint |= {"scheme": "https", "tlsConfig": {"ca": ca, **server}}
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": metadata(job, labels(job, "trainer", "metrics")),
            "spec": {
                "selector": {
                    "matchLabels": {LABEL_JOB: job.metadata.name, LABEL_ROLE: ROLE_WORKER}
                },
                "podMetricsEndpoints": [endpoint],
            },
        }
    ]
