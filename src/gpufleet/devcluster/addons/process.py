"""A controller's manager as a process beside the API server: its configuration, command line,
environment and certificates, written under the cluster's directory (never the machine's /tmp,
but for the one path two managers only check exists: FIXED_CERT_CHECK)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster.addons.base import LOOPBACK, Addon, Certs, Config, Ports
from gpufleet.devcluster.addons.manifests import module_config
from gpufleet.devcluster.pki import Pki, issue
from gpufleet.kube import Obj

# cert-controller's rotation in the training-operator and the Trainer waits until a file exists
# at this fixed path (their pkg/cert and pkg/util/cert certDir constants) before it reports
# ready, while their webhook servers read $TMPDIR's copy; the file only has to exist here.
FIXED_CERT_CHECK = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")


def tmpdir(addon: Addon, workdir: Path) -> Path:
    """The manager's $TMPDIR (its own, never the machine's /tmp)."""
    return workdir / f"{addon.name}-tmp"


def cert_dir(addon: Addon, workdir: Path) -> Path:
    """Where the manager reads its serving certificate."""
    if addon.tmpdir_certs:
        return tmpdir(addon, workdir) / "k8s-webhook-server" / "serving-certs"
    return workdir / f"{addon.name}-certs"


def files_dir(addon: Addon, workdir: Path) -> Path:
    """Where a flag-configured manager's files (``config_files``) are written."""
    return workdir / f"{addon.name}-files"


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
    # Leader election as its Deployment has it, in its own namespace (outside a pod the manager
    # cannot read it from the service account): its Lease is how `gpufleet doctor` sees a
    # manager run outside a pod. A fresh cluster's first manager takes it at once.
    config["leaderElection"] = {**config.get("leaderElection", {}), "leaderElect": True,
                                "resourceNamespace": addon.namespace}  # fmt: skip
    if addon.certs != Certs.ROTATED:
        config["internalCertManagement"] = {"enable": False}
    if addon.feature_gates:
        config["featureGates"] = {**config.get("featureGates", {}), **dict(addon.feature_gates)}
    return config


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
    if addon.config == Config.FILE:
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
    """Write the manager's configuration (and, in cert-manager mode, its serving certificate;
    the files its flags name) under ``workdir``; issue its client certificate. Returns the
    configuration file (None for a manager configured by flags)."""
    certs = cert_dir(addon, workdir)
    shutil.rmtree(certs, ignore_errors=True)  # a previous cluster's
    certs.mkdir(parents=True)
    if addon.certs == Certs.ISSUED:
        name = f"{addon.name}-webhook"
        issue(pki, name, addon.webhook_host, server_names=[addon.webhook_host])
        write_certs(certs, pki.cert(name).read_bytes(), pki.key(name).read_bytes())
    if addon.config_files:
        write_config_files(addon, docs, workdir)
    issue(pki, addon.name, addon.user, addon.groups)
    if addon.config == Config.FLAGS:
        return None
    path = workdir / f"{addon.name}-config.yaml"
    path.write_text(yaml.safe_dump(local_config(addon, docs, ports, certs, extra), sort_keys=False))
    return path
