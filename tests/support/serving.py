"""InferenceService builders and the Prometheus adapter's rules, for the serving tests."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.spec import InferenceService, validate_spec
from tests.support.paths import REPO

ADAPTER = REPO / "deploy" / "prometheus" / "adapter-rules.yaml"


def service(**spec: Any) -> dict[str, Any]:
    """An InferenceService document serving digits from S3; ``spec`` keys override."""
    base: dict[str, Any] = {"model": {"name": "digits", "repository": "s3://models/repo"}}
    base.update(spec)
    return {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "digits", "namespace": "team-a"},
        "spec": base,
    }


def parsed(doc: dict[str, Any]) -> InferenceService:
    """``doc`` validated, as the InferenceService it must be."""
    spec = validate_spec(doc)
    assert isinstance(spec, InferenceService)
    return spec


def adapter_rules() -> list[dict[str, Any]]:
    """The rules of deploy/prometheus/adapter-rules.yaml."""
    return yaml.safe_load(ADAPTER.read_text())["rules"]  # type: ignore[no-any-return]
