"""Strict validation of rendered objects: core kinds with kubernetes-validate, custom kinds with
the JSON Schemas in ../shared/k8s-schemas. CI always has ../shared beside the clone, so a missing
schema fails the test that needs it (a skip would hide every custom-resource check)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.conftest import REPO

K8S_VERSION = "1.33"
SCHEMAS = REPO.parent / "shared" / "k8s-schemas"


@cache
def crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    path = SCHEMAS / group / f"{kind.lower()}_{version}.json"
    if not path.is_file():
        pytest.fail(
            f"no schema for {group}/{version} {kind}: expected {path} (custom resource schemas "
            "come from ../shared/k8s-schemas, which must sit beside the clone)",
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
