"""Strict validation of rendered objects: core kinds with kubernetes-validate, custom kinds with
the JSON Schemas in tests/k8s-schemas/, derived from the CRDs of exactly the controller versions
the project pins (the manifests scripts/build-controlplane.sh extracts from each Go module into
.tools/controlplane/manifests and crds/). `python -m tests.support.k8s_schemas` (`make schemas`)
writes them again after a pin changes; tests/integration/test_k8s_schemas.py checks that doing so
gives the committed bytes. A kind with no schema fails the test that needs it (a skip would hide
every custom-resource check)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from gpufleet.devcluster.addons import CRD, load_manifests
from tests.support.paths import REPO

K8S_VERSION = "1.33"
SCHEMAS = REPO / "tests" / "k8s-schemas"
# Every custom kind a renderer or the chart writes: (group, kind, version).
KINDS = (
    ("batch.volcano.sh", "Job", "v1alpha1"),
    ("jobset.x-k8s.io", "JobSet", "v1alpha2"),
    ("k8s.cni.cncf.io", "NetworkAttachmentDefinition", "v1"),
    ("keda.sh", "ScaledObject", "v1alpha1"),
    ("kubeflow.org", "MPIJob", "v2beta1"),
    ("kubeflow.org", "PyTorchJob", "v1"),
    ("kubeflow.org", "TFJob", "v1"),
    ("kueue.x-k8s.io", "ClusterQueue", "v1beta2"),
    ("kueue.x-k8s.io", "LocalQueue", "v1beta2"),
    ("kueue.x-k8s.io", "ResourceFlavor", "v1beta2"),
    ("kueue.x-k8s.io", "Topology", "v1beta2"),
    ("kueue.x-k8s.io", "WorkloadPriorityClass", "v1beta2"),
    ("monitoring.coreos.com", "PodMonitor", "v1"),
    ("monitoring.coreos.com", "PrometheusRule", "v1"),
    ("monitoring.coreos.com", "ServiceMonitor", "v1"),
    ("ray.io", "RayJob", "v1"),
    ("scheduling.volcano.sh", "Queue", "v1beta1"),
    ("serving.kserve.io", "InferenceService", "v1beta1"),
    ("trainer.kubeflow.org", "TrainJob", "v1alpha1"),
)


def schema_path(group: str, kind: str, version: str) -> Path:
    return SCHEMAS / group / f"{kind.lower()}_{version}.json"


@cache
def crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    path = schema_path(group, kind, version)
    if not path.is_file():
        pytest.fail(
            f"no schema for {group}/{version} {kind}: expected {path.relative_to(REPO)} (add the "
            "kind to KINDS in tests/support/k8s_schemas.py and run `make schemas`)",
            pytrace=False,
        )
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def validate_strictly(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` is not a valid object of its kind (unknown fields rejected)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    if "." in group and not group.endswith(".k8s.io"):  # a custom resource (x-k8s.io is one)
        schema = crd_schema(group, obj["kind"], version)
        # No check of the schema itself: some CRD patterns are Go regexes that Python's re
        # rejects (PrometheusRule's "^(?i)(abort|warn)?$"); they only matter for fields we set.
        jsonschema.validators.validator_for(schema)(schema).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# No maintained library converts a CRD's openAPIV3Schema to a plain JSON Schema (openapi2jsonschema
# is unmaintained and handles only core kinds), so these few rules are written here: the API
# server's structural-schema semantics that a JSON Schema validator lacks.
def strict(node: Any) -> Any:
    """A CRD's openAPIV3Schema as a JSON Schema that refuses unknown fields as the API server's
    pruning and strict field validation do: an object with properties and no
    additionalProperties takes no other field, unless x-kubernetes-preserve-unknown-fields keeps
    them; nullable admits null; x-kubernetes-int-or-string takes either; an embedded resource
    takes apiVersion, kind and metadata."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if out.get("x-kubernetes-embedded-resource") and "properties" in out:
        implicit = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"}}  # fmt: skip
        out["properties"] = {**implicit, **out["properties"]}
    if out.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crds(binaries: Path) -> Iterator[dict[str, Any]]:
    """The CRDs the control-plane build extracted: those of the projects not run here (crds/)
    first, then those the controllers run here install (manifests/), so that where both carry
    a kind, the running controller's wins."""
    for folder in ("crds", "manifests"):
        for path in sorted((binaries / folder).glob("*.y*ml")):
            yield from (doc for doc in load_manifests(path) if doc.get("kind") == CRD)


def generate(binaries: Path) -> dict[Path, str]:
    """Each schema of KINDS as the bytes of its file, from the CRDs under ``binaries``."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for crd in crds(binaries):
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (spec["group"], spec["names"]["kind"], version["name"])
            found[key] = version["schema"]["openAPIV3Schema"]
    missing = [" ".join(k) for k in KINDS if k not in found]
    if missing:
        raise SystemExit(f"no CRD under {binaries} for: {', '.join(missing)}")
    return {
        schema_path(*key): json.dumps(strict(found[key]), indent=1, sort_keys=True) + "\n"
        for key in KINDS
    }


def main() -> None:
    """Write tests/k8s-schemas/ from the built control plane's CRDs (`make schemas`)."""
    from gpufleet.devcluster.build import binaries_dir

    files = generate(binaries_dir())
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    stale = set(SCHEMAS.rglob("*.json")) - set(files)
    for path in stale:
        path.unlink()
    print(f"wrote {len(files)} schemas to {SCHEMAS.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
