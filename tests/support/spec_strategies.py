"""Hypothesis strategies that generate spec documents from the spec's own JSON Schema.

Documents drawn from the schema of the pydantic models (``model_json_schema(by_alias=True)``)
have the right shape and types, so a good share of them validate, and the rest fail on the
rules the schema cannot express (DNS names, cross-field checks). hypothesis-jsonschema would do
this, but its 0.23 release breaks on current hypothesis internals ('many' object has no
attribute 'more'); pydantic emits a small subset of JSON Schema, converted here.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

# Strings that mean something in a spec (names, paths, URIs, products, entry points), mostly
# valid where they land, plus some that are not and some noise.
GOOD = st.sampled_from(["digits", "team-a", "x", "train.py", "/ckpt", "/ckpt/run"])
STRINGS = st.one_of(
    GOOD,
    GOOD,
    st.sampled_from(["-m", "pkg.train", "s3://bucket/ckpt", "NVIDIA-A30", "ghcr.io/x/gpufleet:1",
                     "A_B", "", "Bad Name!"]),
    st.text(max_size=8),
)  # fmt: skip
KEYS = st.one_of(st.sampled_from(["A", "B_1", "gpufleet.dev/x", "bad key"]), st.text(max_size=6))


def from_schema(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> SearchStrategy[Any]:
    """Values valid for ``schema`` (types, bounds, required keys, closed objects)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(defs[name], defs))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return st.one_of([from_schema(s, defs) for s in schema[union]])
    kind = schema.get("type")
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -3) + 1)
        return st.integers(low, min(schema.get("maximum", low + 64), low + 64))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0.0))
        return st.floats(low, low + 1e4, exclude_min="exclusiveMinimum" in schema)
    if kind == "string":
        return STRINGS
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=3)
    if kind == "object":
        return _object(schema, defs)
    return st.nothing()


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> SearchStrategy[Any]:
    props = schema.get("properties")
    if props is None:  # a map: dict[str, X]
        values = from_schema(schema.get("additionalProperties") or {"type": "string"}, defs)
        return st.dictionaries(KEYS, values, max_size=3)
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {k: from_schema(v, defs) for k, v in props.items() if k in required},
        optional={k: from_schema(v, defs) for k, v in props.items() if k not in required},
    )
