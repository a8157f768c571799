"""Volcano: its admission webhooks (which also install the project's manifests), controllers and
scheduler, three processes with the flags of their Deployments (installer/
volcano-development.yaml). Every listener on loopback: the scheduler's metrics listener
defaults to :8080 on every interface, the MPI operator's fixed port."""

from __future__ import annotations

from gpufleet.cluster.doctor.requirements import VOLCANO_ADMISSION_PROCESS
from gpufleet.devcluster.addons.base import Addon, Certs, Config, Ready

VOLCANO = "volcano-system"
_LOGS = ("--logtostderr", "-v=2")

VOLCANO_ADMISSION = Addon(
    name="vc-webhook-manager",
    project="volcano",
    namespace=VOLCANO,
    service_account="volcano-admission",
    certs=Certs.ISSUED,
    webhook_service=VOLCANO_ADMISSION_PROCESS.webhook_service,
    probe=VOLCANO_ADMISSION_PROCESS.probe,
    config=Config.FLAGS,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--listen-address=127.0.0.1",
        "--port={webhook}",
        "--tls-cert-file={certs}/tls.crt",
        "--tls-private-key-file={certs}/tls.key",
        "--ca-cert-file={ca}",
        "--admission-conf={files}/volcano-admission.conf",
        f"--webhook-namespace={VOLCANO}",
        "--webhook-service-name=volcano-admission-service",
        "--enabled-admission=/jobs/mutate,/jobs/validate,/podgroups/mutate,/pods/validate,"
        "/pods/mutate,/queues/mutate,/queues/validate",
        "--enable-healthz=true",
        "--healthz-address=127.0.0.1:{health}",
        *_LOGS,
    ),
    config_files=(("volcano-admission-configmap", "volcano-admission.conf"),),
    ready=Ready.HTTPS,  # its health server takes the serving certificate too
    ready_path="/healthz",
    skip_kinds=("Job",),  # the certificate-making Job: the local cluster issues them
)
VOLCANO_CONTROLLERS = Addon(
    name="vc-controller-manager",
    project="volcano",
    namespace=VOLCANO,
    service_account="volcano-controllers",
    installs=False,
    config=Config.FLAGS,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--enable-healthz=true",
        "--healthz-address=127.0.0.1:{health}",
        *_LOGS,
    ),
    ready_path="/healthz",
)
VOLCANO_SCHEDULER = Addon(
    name="vc-scheduler",
    project="volcano",
    namespace=VOLCANO,
    service_account="volcano-scheduler",
    installs=False,
    config=Config.FLAGS,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--scheduler-conf={files}/volcano-scheduler.conf",
        "--enable-healthz=true",
        "--healthz-address=127.0.0.1:{health}",
        "--enable-metrics=true",
        "--listen-address=127.0.0.1:{metrics}",
        *_LOGS,
    ),
    config_files=(("volcano-scheduler-configmap", "volcano-scheduler.conf"),),
    ready_path="/healthz",
)
