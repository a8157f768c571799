"""Kueue, JobSet, the Kubeflow training-operator and the MPI operator on the local control
plane: their own install manifests (rendered with kustomize from each Go module's
``config/default``, or the Kubeflow operators' ``manifests/overlays/standalone``, by
scripts/build-controlplane.sh) applied as a cluster would get them, and their managers run as
processes beside the API server.

What changes because the managers run beside the API server instead of in pods (what kwokctl
does for its components), and nothing else:

- the Deployments are not applied (the process is started instead), nor Kueue's visibility
  APIService (``VisibilityOnDemand`` off: an unreachable aggregated API blocks namespace
  deletion) and its Service;
- each webhook Service becomes ``type: ExternalName`` -> 127.0.0.1 on the manager's webhook
  port; the API server resolves it and checks TLS against ``<service>.<namespace>.svc``;
- webhook certificates: each manager in the mode that needs no fixed path on this machine.
  Kueue rotates its own (its default): it writes them to a Secret and injects its CA into its
  webhooks and CRDs; we do the kubelet's part and copy the Secret into the manager's certificate
  directory (with internal rotation off it would read a fixed /etc/kueue path). JobSet's
  rotation checks a fixed /tmp path, so it runs in its cert-manager mode and we do
  cert-manager's part: a serving certificate from the local CA, whose certificate goes into
  every webhook's and conversion webhook's caBundle. The training-operator always rotates its
  own (open-policy-agent/cert-controller, into its Secret); its webhook server reads them from
  controller-runtime's default directory under $TMPDIR, which we point at the cluster's own;
- the manager's configuration is the module's own ConfigMap with loopback addresses, its own
  ports and certificate directory, and no leader election (the training-operator takes flags
  instead: the Deployment's, plus the same changes);
- the manager authenticates with a client certificate carrying its ServiceAccount's user name
  and groups, so the module's own RBAC (bound to that ServiceAccount) is what authorizes it.
"""

from __future__ import annotations

import base64
import copy
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster.pki import Pki, issue
from gpufleet.kube import Obj

LOOPBACK = "127.0.0.1"
CRD = "CustomResourceDefinition"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass(frozen=True)
class Addon:
    """A controller installed from its module's manifests and run as a local process."""

    name: str  # also the binary's and the manifest file's name
    namespace: str
    service_account: str
    webhook_service: str | None  # None: it serves no webhook
    # A valid object of the addon's own kind, created with dryRun once the manager is ready:
    # the API server calls the webhooks for it, so success means they answer through the API.
    probe: Obj | None
    # The Secret the manager's own certificate rotation writes; None: it runs in cert-manager
    # mode and we issue its serving certificate.
    cert_secret: str | None = None
    feature_gates: tuple[tuple[str, bool], ...] = ()
    skip_services: tuple[str, ...] = ()
    # A manager configured by command-line flags, not by the module's ConfigMap file: its flags,
    # formatted with the ports ({webhook}, {health}, {metrics}) and {kubeconfig}.
    flags: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    # Its webhook server reads the serving certificate from controller-runtime's default,
    # $TMPDIR/k8s-webhook-server/serving-certs (it has no flag for the directory).
    tmpdir_certs: bool = False
    skip_crds: tuple[str, ...] = ()
    # The Kueue integration (``integrations.frameworks``) for this controller's kinds: Kueue's
    # default configuration leaves some off (kubeflow.org/pytorchjob), a queued job of that
    # kind would stay suspended; the local cluster turns it on when the controller runs.
    kueue_framework: str | None = None
    # A manager with no readiness endpoint of its own on a port we choose: ready once it holds
    # this leader-election Lease in its namespace (it works only while leading).
    ready_lease: str | None = None
    # Ports it binds on every interface whatever its flags say (an upstream constant): checked
    # free before it starts, so a second cluster on the machine fails saying which.
    fixed_ports: tuple[int, ...] = ()
    # Controllers it cannot work without (the Trainer runs TrainJobs as JobSets).
    requires: tuple[str, ...] = ()
    # Objects of its own kinds from its module, applied once its webhooks answer (the Trainer's
    # ClusterTrainingRuntimes): the name of a manifest file beside its own.
    after_ready: str | None = None
    # Its install manifests (manifests/<manifest>.yaml); None: a process of a project whose
    # first process installed them (Volcano's controllers and scheduler).
    manifest: str | None = ""  # "": the addon's name
    # What `--without` calls it: a project of several processes is left out whole.
    project: str = ""  # "": the addon's name
    # Files a flag-configured manager reads, from ConfigMaps of its manifests (ConfigMap name,
    # key): written to {files}/<key>.
    config_files: tuple[tuple[str, str], ...] = ()
    # Its readiness endpoint on the health port: path, and whether it is served over TLS.
    ready_path: str = "/readyz"
    ready_tls: bool = False
    # Kinds of its manifests that run in a cluster as workloads and are replaced here by the
    # process (the Deployment always is): Volcano's certificate-making Job.
    skip_kinds: tuple[str, ...] = ()

    @property
    def manifest_name(self) -> str | None:
        return self.name if self.manifest == "" else self.manifest

    @property
    def project_name(self) -> str:
        return self.project or self.name

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def groups(self) -> tuple[str, ...]:
        return ("system:serviceaccounts", f"system:serviceaccounts:{self.namespace}")

    @property
    def webhook_host(self) -> str:
        assert self.webhook_service is not None
        return f"{self.webhook_service}.{self.namespace}.svc"


KUEUE = Addon(
    "kueue",
    "kueue-system",
    "kueue-controller-manager",
    "kueue-webhook-service",
    probe={
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpufleet-webhook-probe"},
    },
    cert_secret="kueue-webhook-server-cert",
    feature_gates=(("VisibilityOnDemand", False),),
    skip_services=("kueue-visibility-server",),
)
JOBSET = Addon(
    "jobset",
    "jobset-system",
    "jobset-controller-manager",
    "jobset-webhook-service",
    probe={
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "gpufleet-webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "probe",
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "probe", "image": "probe"}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    },
)
# The schemes the training-operator runs: all of its v1.9 kinds but MPIJob, whose CRD and
# controller belong to the MPI operator (kubeflow.org/v2beta1) in a cluster that has both (what
# Kueue's and the MPI operator's install guides say to do).
TRAINING_OPERATOR_SCHEMES = ("pytorchjob", "tfjob", "xgboostjob", "paddlejob", "jaxjob")
TRAINING_OPERATOR = Addon(
    "training-operator",
    "kubeflow",
    "training-operator",
    "training-operator",
    probe={
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "gpufleet-webhook-probe", "namespace": "default"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "template": {"spec": {"containers": [{"name": "pytorch", "image": "probe"}]}},
                }
            }
        },
    },
    cert_secret="training-operator-webhook-cert",
    flags=(
        "--kubeconfig={kubeconfig}",
        "--metrics-bind-address=127.0.0.1:{metrics}",
        "--health-probe-bind-address=127.0.0.1:{health}",
        # The webhook server listens on every interface: v1.9 has no flag for its host (TLS,
        # and only the API server's calls are answered with anything but an error).
        "--webhook-server-port={webhook}",
        "--leader-elect=false",
        "--zap-log-level=info",
        *(f"--enable-scheme={s}" for s in TRAINING_OPERATOR_SCHEMES),
    ),
    env=(("MY_POD_NAMESPACE", "kubeflow"),),
    tmpdir_certs=True,
    skip_crds=("mpijobs.kubeflow.org",),
    kueue_framework="kubeflow.org/pytorchjob",
)
MPI_OPERATOR = Addon(
    "mpi-operator",
    "mpi-operator",
    "mpi-operator",
    None,
    None,
    flags=(
        # Its Deployment's flags (base + standalone overlay). The MPI operator reads $KUBECONFIG
        # before this flag, so environment() sets both to its own kubeconfig.
        "--kubeConfig={kubeconfig}",
        "--lock-namespace=mpi-operator",
        "-alsologtostderr",
    ),
    kueue_framework="kubeflow.org/mpijob",
    ready_lease="mpi-operator",
    # cmd/mpi-operator/app/server.go: healthCheckPort = 8080, on every interface (/healthz only).
    fixed_ports=(8080,),
)
TRAINER_PROBE: Obj = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "gpufleet-webhook-probe"},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
            "template": {"spec": {"containers": [{"name": "node", "image": "probe"}]}}}}}]}},
    },
}  # fmt: skip
TRAINER = Addon(
    "trainer",
    "kubeflow-system",
    "kubeflow-trainer-controller-manager",
    "kubeflow-trainer-controller-manager",
    probe={
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "gpufleet-webhook-probe"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {"containers": [{"name": "node", "image": "probe"}]}
                                    }
                                }
                            },
                        }
                    ]
                }
            },
        },
    },
    cert_secret="kubeflow-trainer-webhook-cert",
    tmpdir_certs=True,  # same rotation (pkg/util/cert), same fixed check path
    kueue_framework="trainer.kubeflow.org/trainjob",
    requires=("jobset",),
    after_ready="trainer-runtimes",
)
# Volcano: its admission webhooks (which also install the project's manifests), controllers and
# scheduler, three processes with the flags of their Deployments (installer/
# volcano-development.yaml). Every listener on loopback: the scheduler's metrics listener
# defaults to :8080 on every interface, the MPI operator's fixed port.
VOLCANO = "volcano-system"
VOLCANO_ADMISSION = Addon(
    "vc-webhook-manager",
    VOLCANO,
    "volcano-admission",
    "volcano-admission-service",
    probe={
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "gpufleet-webhook-probe"},
        "spec": {"weight": 1},
    },
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
        "--logtostderr",
        "-v=2",
    ),
    manifest="volcano",
    project="volcano",
    config_files=(("volcano-admission-configmap", "volcano-admission.conf"),),
    ready_path="/healthz",
    ready_tls=True,  # its health server takes the serving certificate too
    skip_kinds=("Job",),
)
VOLCANO_CONTROLLERS = Addon(
    "vc-controller-manager",
    VOLCANO,
    "volcano-controllers",
    None,
    None,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--enable-healthz=true",
        "--healthz-address=127.0.0.1:{health}",
        "--leader-elect=false",
        "--logtostderr",
        "-v=2",
    ),
    manifest=None,
    project="volcano",
    ready_path="/healthz",
)
VOLCANO_SCHEDULER = Addon(
    "vc-scheduler",
    VOLCANO,
    "volcano-scheduler",
    None,
    None,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--scheduler-conf={files}/volcano-scheduler.conf",
        "--enable-healthz=true",
        "--healthz-address=127.0.0.1:{health}",
        "--enable-metrics=true",
        "--listen-address=127.0.0.1:{metrics}",
        "--leader-elect=false",
        "--logtostderr",
        "-v=2",
    ),
    manifest=None,
    project="volcano",
    config_files=(("volcano-scheduler-configmap", "volcano-scheduler.conf"),),
    ready_path="/healthz",
)
ADDONS = (
    KUEUE, JOBSET, TRAINING_OPERATOR, MPI_OPERATOR, TRAINER,
    VOLCANO_ADMISSION, VOLCANO_CONTROLLERS, VOLCANO_SCHEDULER,
)  # fmt: skip
PROJECTS = tuple(dict.fromkeys(a.project_name for a in ADDONS))


@dataclass(frozen=True)
class Ports:
    webhook: int
    health: int
    metrics: int


def load_manifests(path: Path) -> list[Obj]:
    """The documents of a rendered manifest file (empty documents dropped). libyaml's safe
    loader where PyYAML has it: the controllers' manifests are megabytes of CRD schemas, which
    the pure-Python loader takes most of `cluster up`'s 45 s to read (these are the modules'
    own files, not user input)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open() as f:
        return [d for d in yaml.load_all(f, Loader=loader) if d]


def module_config(docs: list[Obj]) -> dict[str, Any]:
    """The manager configuration the module's Deployment mounts (its ConfigMap's one file)."""
    for doc in docs:
        if doc["kind"] == "ConfigMap" and "controller_manager_config.yaml" in doc.get("data", {}):
            loaded = yaml.safe_load(doc["data"]["controller_manager_config.yaml"])
            assert isinstance(loaded, dict)
            return loaded
    raise ValueError("no controller_manager_config.yaml ConfigMap in the manifests")


# Kueue's quota gauges per ClusterQueue, flavor and resource (cluster_queue_resource_usage,
# _nominal_quota, _borrowing_limit, ...: the Queues dashboard's), off in its default configuration.
KUEUE_METRICS = {"metrics": {"enableClusterQueueResources": True}}

# Kueue's fair sharing among the ClusterQueues of a cohort (off in its default configuration;
# present: on), with the preemption strategies Kueue's documentation shows.
KUEUE_FAIR_SHARING = {
    "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
}


def local_config(
    addon: Addon, docs: list[Obj], ports: Ports, cert_dir: Path, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The module's configuration, changed only where a local process must differ (and by
    ``extra``, top-level keys the user chose, such as KUEUE_FAIR_SHARING)."""
    config = copy.deepcopy(module_config(docs)) | copy.deepcopy(extra or {})
    config["health"] = {**config.get("health", {}),
                        "healthProbeBindAddress": f"{LOOPBACK}:{ports.health}"}  # fmt: skip
    config["metrics"] = {**config.get("metrics", {}),
                         "bindAddress": f"{LOOPBACK}:{ports.metrics}"}  # fmt: skip
    config["webhook"] = {"host": LOOPBACK, "port": ports.webhook}
    if not addon.tmpdir_certs:  # a manager that reads $TMPDIR's has no such setting
        config["webhook"]["certDir"] = str(cert_dir)
    config["leaderElection"] = {"leaderElect": False}
    if addon.cert_secret is None:
        config["internalCertManagement"] = {"enable": False}
    if addon.feature_gates:
        config["featureGates"] = {**config.get("featureGates", {}), **dict(addon.feature_gates)}
    return config


def cluster_objects(addon: Addon, docs: list[Obj], ca_pem: bytes, webhook_port: int) -> list[Obj]:
    """What is applied to the API server: the manifests less the Deployment, the manager's
    ConfigMap and the aggregated APIs; the webhook Service pointed at loopback; every webhook
    (and CRD conversion webhook) called on the manager's port, with the local CA as its
    caBundle unless the manager injects its own."""
    out = []
    ca_bundle = None if addon.cert_secret else base64.b64encode(ca_pem).decode()
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("Deployment", "APIService", *addon.skip_kinds):
            continue
        if kind == "ConfigMap" and "controller_manager_config.yaml" in doc.get("data", {}):
            continue
        if kind == "Service" and name in addon.skip_services:
            continue
        if kind == CRD and name in addon.skip_crds:
            continue
        doc = copy.deepcopy(doc)
        if kind == "Service" and name == addon.webhook_service:
            doc["spec"] = {
                "type": "ExternalName",
                "externalName": LOOPBACK,
                "ports": [{"name": "webhook", "port": webhook_port, "protocol": "TCP"}],
            }
        if kind in WEBHOOK_KINDS:
            for hook in doc.get("webhooks", []):
                _point(hook["clientConfig"], ca_bundle, webhook_port)
        conversion = doc.get("spec", {}).get("conversion", {}) if kind == CRD else {}
        if conversion.get("strategy") == "Webhook":  # served by the same manager
            _point(conversion["webhook"]["clientConfig"], ca_bundle, webhook_port)
        out.append(doc)
    return out


def _point(client_config: dict[str, Any], ca_bundle: str | None, port: int) -> None:
    client_config["service"]["port"] = port
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle


def crd_names(objects: list[Obj]) -> Iterator[str]:
    for obj in objects:
        if obj["kind"] == CRD:
            yield obj["metadata"]["name"]


def tmpdir(addon: Addon, workdir: Path) -> Path:
    """The manager's $TMPDIR (its own, never the machine's /tmp)."""
    return workdir / f"{addon.name}-tmp"


def cert_dir(addon: Addon, workdir: Path) -> Path:
    if addon.tmpdir_certs:
        return tmpdir(addon, workdir) / "k8s-webhook-server" / "serving-certs"
    return workdir / f"{addon.name}-certs"


# cert-controller's rotation in the training-operator and the Trainer waits until a file exists
# at this fixed path (their pkg/cert and pkg/util/cert certDir constants) before it reports
# ready, while their webhook servers read $TMPDIR's copy; the file only has to exist here.
FIXED_CERT_CHECK = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")


def files_dir(addon: Addon, workdir: Path) -> Path:
    return workdir / f"{addon.name}-files"


def argv(
    addon: Addon,
    binary: Path,
    config: Path | None,
    kubeconfig: Path,
    ports: Ports,
    workdir: Path | None = None,
    ca: Path | None = None,
) -> list[str]:
    """The manager's command line: its configuration file, or its flags."""
    if addon.flags is None:
        return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}"]
    values = {"webhook": ports.webhook, "health": ports.health, "metrics": ports.metrics,
              "kubeconfig": kubeconfig, "ca": ca}  # fmt: skip
    if workdir is not None:
        values |= {"certs": cert_dir(addon, workdir), "files": files_dir(addon, workdir)}
    return [str(binary), *(flag.format(**values) for flag in addon.flags)]


def write_config_files(addon: Addon, docs: list[Obj], workdir: Path) -> None:
    """The files ``addon.config_files`` names, from its ConfigMaps, as a mounted ConfigMap."""
    directory = files_dir(addon, workdir)
    directory.mkdir(parents=True, exist_ok=True)
    for configmap, key in addon.config_files:
        found = [d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"] == configmap]  # fmt: skip
        if not found or key not in found[0].get("data", {}):
            raise ValueError(f"{addon.name}: no ConfigMap {configmap} with {key} in its manifests")
        (directory / key).write_text(found[0]["data"][key])


def environment(addon: Addon, workdir: Path, kubeconfig: Path) -> dict[str, str]:
    """What the manager's process adds to the environment: its own settings, $KUBECONFIG (some
    read it before their flag; never the user's), $TMPDIR where it keeps certificates."""
    env = {**dict(addon.env), "KUBECONFIG": str(kubeconfig)}
    if addon.tmpdir_certs:
        env["TMPDIR"] = str(tmpdir(addon, workdir))
    return env


def kueue_frameworks(docs: list[Obj], running: list[Addon]) -> dict[str, Any]:
    """Kueue's ``integrations`` with the frameworks of the controllers in ``running`` added."""
    integrations = copy.deepcopy(module_config(docs).get("integrations", {}))
    frameworks = list(integrations.get("frameworks", []))
    for addon in running:
        if addon.kueue_framework and addon.kueue_framework not in frameworks:
            frameworks.append(addon.kueue_framework)
    return {"integrations": {**integrations, "frameworks": frameworks}}


def write_certs(directory: Path, cert: bytes, key: bytes) -> None:
    """The serving certificate as a mounted Secret would hold it (tls.crt, tls.key)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    (directory / "tls.key").write_bytes(key)
    (directory / "tls.key").chmod(0o600)
    (directory / "tls.crt").write_bytes(cert)  # last: the managers wait for this file


def prepare(
    addon: Addon,
    pki: Pki,
    workdir: Path,
    docs: list[Obj],
    ports: Ports,
    extra: dict[str, Any] | None = None,
) -> Path | None:
    """Write the manager's configuration (and, in cert-manager mode, its serving certificate)
    under ``workdir``; issue its client certificate. Returns the configuration file (None for a
    manager configured by flags)."""
    certs = cert_dir(addon, workdir)
    shutil.rmtree(certs, ignore_errors=True)  # a previous cluster's
    certs.mkdir(parents=True)
    if addon.cert_secret is None and addon.webhook_service is not None:
        name = f"{addon.name}-webhook"
        issue(pki, name, addon.webhook_host, server_names=[addon.webhook_host])
        write_certs(certs, pki.cert(name).read_bytes(), pki.key(name).read_bytes())
    issue(pki, addon.name, addon.user, addon.groups)
    if addon.flags is not None:
        return None
    path = workdir / f"{addon.name}-config.yaml"
    path.write_text(yaml.safe_dump(local_config(addon, docs, ports, certs, extra), sort_keys=False))
    return path
