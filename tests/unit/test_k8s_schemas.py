"""The CRD-to-JSON-Schema conversion keeps the API server's strictness, and the committed schemas
refuse what a real API server would: an unknown field where the CRD lists the fields, nothing
where it keeps unknown fields."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.support.k8s_schemas import KINDS, SCHEMAS, schema_path, strict, validate_strictly

CRD = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "replicas": {"type": "integer", "nullable": True},
                "port": {"x-kubernetes-int-or-string": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "config": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"known": {"type": "string"}},
                },
                "template": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "properties": {"spec": {"type": "object"}},
                },
            },
        }
    },
}


def valid(spec: dict[str, Any]) -> bool:
    schema = strict(CRD)
    return not list(jsonschema.Draft7Validator(schema).iter_errors({"spec": spec}))


def test_unknown_fields_refused_where_the_crd_lists_fields() -> None:
    assert valid({"replicas": 1})
    assert not valid({"replica": 1})
    assert strict(CRD)["additionalProperties"] is False  # the top level too


def test_preserve_unknown_fields_and_maps_keep_other_keys() -> None:
    assert valid({"config": {"known": "a", "anything": {"deep": [1]}}})
    assert valid({"labels": {"a": "b"}})
    assert not valid({"labels": {"a": 1}})


def test_nullable_int_or_string_and_embedded_resources() -> None:
    assert valid({"replicas": None, "port": 8080}) and valid({"port": "http"})
    assert not valid({"port": 1.5})
    assert valid({"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}})
    assert not valid({"template": {"spce": {}}})


def test_every_kind_has_a_committed_schema_and_nothing_else_is_there() -> None:
    paths = {schema_path(*kind) for kind in KINDS}
    assert all(path.is_file() for path in paths), "run `make schemas`"
    assert set(SCHEMAS.rglob("*.json")) == paths


@pytest.mark.parametrize(
    "obj",
    [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "a"},
            "spec": {"replicatedJob": []},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "a"},
            "spec": {"clusterQueue": "q", "cohort": "c"},
        },
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "a"},
            "spec": {"predictor": {"tritonn": {}}},
        },
    ],
    ids=lambda obj: obj["kind"],
)
def test_committed_schemas_refuse_an_unknown_field(obj: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        validate_strictly(obj)


def test_a_field_the_crd_keeps_open_takes_anything() -> None:
    """KServe's InferenceService keeps unknown fields in its status: any field validates there."""
    obj = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "a"},
        "spec": {"predictor": {}},
        "status": {"anything": {"deep": [1, "x"]}},
    }
    validate_strictly(obj)
