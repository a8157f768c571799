"""A controller's install manifests, as its module renders them (scripts/build-controlplane.sh,
kustomize), and what of them is applied when its manager runs beside the API server."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpufleet.cluster.doctor.requirements import MANAGER_CONFIG_KEY
from gpufleet.devcluster.addons.base import LOOPBACK, Addon, Certs
from gpufleet.kube import Obj

CRD = "CustomResourceDefinition"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
MANAGER_CONFIG = MANAGER_CONFIG_KEY  # the key of the manager's ConfigMap


def manifest_path(binaries: Path, addon: Addon) -> Path:
    """The install manifests of the addon's project, rendered from its module by the build."""
    return binaries / "manifests" / f"{addon.project}.yaml"


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
        if doc["kind"] == "ConfigMap" and MANAGER_CONFIG in doc.get("data", {}):
            loaded = yaml.safe_load(doc["data"][MANAGER_CONFIG])
            if not isinstance(loaded, dict):
                raise ValueError(f"{MANAGER_CONFIG} in the manifests is not a mapping")
            return loaded
    raise ValueError(f"no {MANAGER_CONFIG} ConfigMap in the manifests")


def _manager_config(doc: Obj) -> bool:
    return doc["kind"] == "ConfigMap" and MANAGER_CONFIG in doc.get("data", {})


def _applied(addon: Addon, doc: Obj) -> bool:
    """Whether a manifest document is applied here as it is: not the Deployment (the process
    runs instead), the manager's ConfigMap (applied with what it runs with), aggregated APIs,
    nor what the addon skips."""
    kind, name = doc["kind"], doc["metadata"]["name"]
    if kind in ("Deployment", "APIService", *addon.skip_kinds):
        return False
    if _manager_config(doc):
        return False
    if kind == "Service" and name in addon.skip_services:
        return False
    return not (kind == CRD and name in addon.skip_crds)


def cluster_objects(
    addon: Addon, docs: list[Obj], ca_pem: bytes, webhook_port: int, config: str | None = None
) -> list[Obj]:
    """What is applied to the API server: the manifests less the Deployment and the aggregated
    APIs; the manager's ConfigMap holding ``config``, the configuration it runs with (left out
    without one), so the cluster tells what it runs with, as it does with the Deployment's
    (`gpufleet doctor` reads Kueue's integrations there); the webhook Service pointed at
    loopback; every webhook (and CRD conversion webhook) called on the manager's port, with
    the local CA as its caBundle unless the manager injects its own."""
    out = []
    ca_bundle = None if addon.certs == Certs.ROTATED else base64.b64encode(ca_pem).decode()
    for doc in docs:
        if config is not None and _manager_config(doc):
            out.append({**doc, "data": {MANAGER_CONFIG: config}})
        if not _applied(addon, doc):
            continue
        doc = copy.deepcopy(doc)
        kind, name = doc["kind"], doc["metadata"]["name"]
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
    """The names of the CustomResourceDefinitions among ``objects``."""
    for obj in objects:
        if obj["kind"] == CRD:
            yield obj["metadata"]["name"]
