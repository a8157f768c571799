"""What a controller installed from its module's manifests is, as data: ``Addon``, with its
modes spelled out (``Certs``, ``Config``, ``Ready``) and checked when it is declared."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpufleet.kube import Obj

LOOPBACK = "127.0.0.1"


class Certs(Enum):
    """Where the manager's webhook serving certificate comes from."""

    NONE = "none"  # it serves no webhook
    ISSUED = "issued"  # cert-manager mode: we issue it from the local CA (cert-manager's part)
    ROTATED = "rotated"  # its own rotation writes ``cert_secret``; we copy it (the kubelet's part)


class Config(Enum):
    """How the manager is configured."""

    FILE = "file"  # the module's ConfigMap file, changed only where a local process must differ
    FLAGS = "flags"  # command-line flags (``flags``), as its Deployment passes them


class Ready(Enum):
    """How to tell the manager is ready."""

    HTTP = "http"  # GET ``ready_path`` on its health port
    HTTPS = "https"  # the same over TLS (its health server takes the serving certificate)
    LEASE = "lease"  # it holds its leader-election Lease ``ready_lease`` (works only leading)


@dataclass(frozen=True, kw_only=True)
class Addon:
    """A controller installed from its module's manifests and run as a local process."""

    name: str  # also its binary's name
    project: str  # what `--without` calls it; its manifests are manifests/<project>.yaml
    namespace: str
    service_account: str
    # Whether this process installs its project's manifests (False: another process of the
    # project did, as Volcano's admission does for its controllers and scheduler).
    installs: bool = True
    certs: Certs = Certs.NONE
    webhook_service: str = ""  # the Service its webhooks are called through (certs != NONE)
    cert_secret: str = ""  # the Secret its own rotation writes (certs == ROTATED)
    # A valid object of the addon's own kind, created with dryRun once the manager is ready:
    # the API server calls the webhooks for it, so success means they answer through the API.
    probe: Obj | None = None
    config: Config = Config.FILE
    # Config.FLAGS: its flags, formatted with the ports ({webhook}, {health}, {metrics}),
    # {kubeconfig}, {ca}, {certs} and {files}.
    flags: tuple[str, ...] = ()
    ready: Ready = Ready.HTTP
    ready_path: str = "/readyz"
    ready_lease: str = ""  # Ready.LEASE: the Lease's name in its namespace
    feature_gates: tuple[tuple[str, bool], ...] = ()
    skip_services: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Its webhook server reads the serving certificate from controller-runtime's default,
    # $TMPDIR/k8s-webhook-server/serving-certs (it has no flag for the directory).
    tmpdir_certs: bool = False
    skip_crds: tuple[str, ...] = ()
    # The Kueue integrations (``integrations.frameworks``) for this controller's kinds: Kueue's
    # default configuration leaves some off (kubeflow.org/pytorchjob), a queued job of that
    # kind would stay suspended; the local cluster turns it on when the controller runs.
    kueue_frameworks: tuple[str, ...] = ()
    # Ports it binds on every interface whatever its flags say (an upstream constant): checked
    # free before it starts, so a second cluster on the machine fails saying which.
    fixed_ports: tuple[int, ...] = ()
    # Projects it cannot work without (the Trainer runs TrainJobs as JobSets).
    requires: tuple[str, ...] = ()
    # Objects of its own kinds from its module, applied once its webhooks answer (the Trainer's
    # ClusterTrainingRuntimes): the name of a manifest file beside its own.
    after_ready: str = ""
    # Files a flag-configured manager reads, from ConfigMaps of its manifests (ConfigMap name,
    # key): written to {files}/<key>.
    config_files: tuple[tuple[str, str], ...] = ()
    # Kinds of its manifests that run in a cluster as workloads and are replaced here by the
    # process (the Deployment always is): Volcano's certificate-making Job.
    skip_kinds: tuple[str, ...] = ()
    # Off unless `cluster up --with <project>` asks (Sealed Secrets); the others run unless
    # `--without` leaves them out.
    optional: bool = False
    # It reads only the in-cluster configuration (no kubeconfig flag): it runs in a mount
    # namespace of its own with its ServiceAccount's files (addons/sealed.py).
    in_cluster: bool = False
    # A path on its health port that serves its public certificate, written to
    # <cluster dir>/<name>.pem once it is ready (Sealed Secrets': what kubeseal seals with).
    public_cert: str = ""

    def __post_init__(self) -> None:
        wrong = [
            (self.certs != Certs.NONE) != bool(self.webhook_service) and "webhook_service",
            (self.certs == Certs.ROTATED) != bool(self.cert_secret) and "cert_secret",
            (self.config == Config.FLAGS) != bool(self.flags) and "flags",
            (self.ready == Ready.LEASE) != bool(self.ready_lease) and "ready_lease",
            (self.certs == Certs.NONE) != (self.probe is None) and "probe",
        ]
        if any(wrong):
            raise ValueError(
                f"{self.name}: {', '.join(w for w in wrong if w)} disagree with its modes"
            )

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def groups(self) -> tuple[str, ...]:
        return ("system:serviceaccounts", f"system:serviceaccounts:{self.namespace}")

    @property
    def webhook_host(self) -> str:
        return f"{self.webhook_service}.{self.namespace}.svc"


@dataclass(frozen=True)
class Ports:
    """The ports one controller manager serves on: its webhook, health probes and metrics."""

    webhook: int
    health: int
    metrics: int
