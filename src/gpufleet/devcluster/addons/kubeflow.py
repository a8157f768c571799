"""The Kubeflow controllers: the training-operator (PyTorchJob, TFJob, ...), the MPI operator
(MPIJob v2beta1) and the Kubeflow Trainer (TrainJob, run as JobSets)."""

from __future__ import annotations

from gpufleet.cluster.doctor.requirements import (
    MPI_OPERATOR_MANAGER,
    TRAINER_MANAGER,
    TRAINING_OPERATOR_MANAGER,
)
from gpufleet.devcluster.addons.base import Addon, Certs, Config, Ready

# The schemes the training-operator runs: all of its v1.9 kinds but MPIJob, whose CRD and
# controller belong to the MPI operator (kubeflow.org/v2beta1) in a cluster that has both (what
# Kueue's and the MPI operator's install guides say to do).
TRAINING_OPERATOR_SCHEMES = ("pytorchjob", "tfjob", "xgboostjob", "paddlejob", "jaxjob")

# It always rotates its own certificate (open-policy-agent/cert-controller, into its Secret);
# its webhook server reads it from controller-runtime's default directory under $TMPDIR.
TRAINING_OPERATOR = Addon(
    name="training-operator",
    project="training-operator",
    namespace="kubeflow",
    service_account="training-operator",
    certs=Certs.ROTATED,
    webhook_service=TRAINING_OPERATOR_MANAGER.webhook_service,
    cert_secret="training-operator-webhook-cert",
    probe=TRAINING_OPERATOR_MANAGER.probe,
    config=Config.FLAGS,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--metrics-bind-address=127.0.0.1:{metrics}",
        "--health-probe-bind-address=127.0.0.1:{health}",
        # The webhook server listens on every interface: v1.9 has no flag for its host (TLS,
        # and only the API server's calls are answered with anything but an error).
        "--webhook-server-port={webhook}",
        # As its Deployment: with leader election, outside a pod it finds no Lease namespace.
        "--leader-elect=false",
        "--zap-log-level=info",
        *(f"--enable-scheme={s}" for s in TRAINING_OPERATOR_SCHEMES),
    ),
    env=(("MY_POD_NAMESPACE", "kubeflow"),),
    tmpdir_certs=True,
    skip_crds=("mpijobs.kubeflow.org",),
    kueue_frameworks=("kubeflow.org/pytorchjob", "kubeflow.org/tfjob"),
)

MPI_OPERATOR = Addon(
    name="mpi-operator",
    project="mpi-operator",
    namespace="mpi-operator",
    service_account="mpi-operator",
    config=Config.FLAGS,
    flags=(
        # Its Deployment's flags (base + standalone overlay). The MPI operator reads $KUBECONFIG
        # before this flag, so environment() sets both to its own kubeconfig.
        "--kubeConfig={kubeconfig}",
        "--lock-namespace=mpi-operator",
        "-alsologtostderr",
    ),
    # No readiness endpoint on a port we choose: ready once it holds its leader-election Lease
    # (it works only while leading).
    ready=Ready.LEASE,
    ready_lease=MPI_OPERATOR_MANAGER.lease,
    kueue_frameworks=("kubeflow.org/mpijob",),
    # cmd/mpi-operator/app/server.go: healthCheckPort = 8080, on every interface (/healthz only).
    fixed_ports=(8080,),
)

TRAINER = Addon(
    name="trainer",
    project="trainer",
    namespace="kubeflow-system",
    service_account="kubeflow-trainer-controller-manager",
    certs=Certs.ROTATED,
    webhook_service=TRAINER_MANAGER.webhook_service,
    cert_secret="kubeflow-trainer-webhook-cert",
    probe=TRAINER_MANAGER.probe,
    tmpdir_certs=True,  # the training-operator's rotation (pkg/util/cert), same fixed check path
    kueue_frameworks=("trainer.kubeflow.org/trainjob",),
    requires=("jobset",),
    after_ready="trainer-runtimes",
)
