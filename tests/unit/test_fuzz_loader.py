"""Fuzz the spec loader: whatever the input, only UserInputError (exit 2) comes out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.errors import UserInputError
from gpufleet.spec import load_training_job, validate_training_job
from gpufleet.spec.loader import parse_override
from tests.conftest import digits_job

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "nodes", "procsPerNode", "resources", "env", "checkpoint", "maxRestarts", "hangTimeout",
    "preemption", "image", "queue", "priority", "volumes", "command", "workload",
]  # fmt: skip


def _loads_or_user_error(doc: Any) -> None:
    try:
        validate_training_job(doc)
    except UserInputError as exc:
        assert exc.errors
        assert all(isinstance(e.path, str) and e.message for e in exc.errors)
        str(exc)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=values)
def test_any_field_value(field: str, value: Any) -> None:
    _loads_or_user_error(digits_job(**{field: value}))


@settings(max_examples=200, deadline=None)
@given(doc=values)
def test_any_document(doc: Any) -> None:
    _loads_or_user_error(doc)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.one_of(
        st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))
    )
)
def test_any_file_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_training_job(path)
    except UserInputError as exc:
        assert exc.errors


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=st.fixed_dictionaries({"spec": st.dictionaries(st.sampled_from(FIELDS), values)}))
def test_any_yaml_mutation(tmp_path: Path, doc: dict[str, Any]) -> None:
    base = digits_job()
    base["spec"].update(doc["spec"])
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(base))
    try:
        load_training_job(path)
    except UserInputError as exc:
        assert exc.errors


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40))
def test_any_override(text: str) -> None:
    try:
        parse_override(text)
    except UserInputError as exc:
        assert exc.errors[0].path == "--set"
