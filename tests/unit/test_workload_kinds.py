"""The built-in workload kinds are listed once (gpufleet.spec.workloads), and the spec's schema,
the loader's error paths and the worker's dispatch agree with that list."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from gpufleet.errors import UserInputError
from gpufleet.runtime.context import ENV_WORKLOAD, JobContext
from gpufleet.spec import WORKLOAD_KINDS, TrainingJob, validate_training_job
from gpufleet.spec.workloads import Workload
from gpufleet.workloads import __main__ as worker
from tests.support.specs import digits_job


def test_each_kind_is_listed_once_under_its_own_name() -> None:
    models = get_args(get_args(Workload)[0])
    names = [get_args(model.model_fields["name"].annotation) for model in models]
    assert all(len(name) == 1 for name in names)  # one name per model
    assert len({name for (name,) in names}) == len(models)  # no name twice
    assert list(WORKLOAD_KINDS.items()) == [
        (name, m) for (name,), m in zip(names, models, strict=True)
    ]


def test_the_schema_offers_exactly_the_listed_kinds() -> None:
    schema = TrainingJob.model_json_schema(by_alias=True)
    workload = schema["$defs"]["TrainingJobSpec"]["properties"]["workload"]
    union = next(part for part in workload["anyOf"] if "discriminator" in part)
    assert set(union["discriminator"]["mapping"]) == set(WORKLOAD_KINDS)


@pytest.mark.parametrize("name", sorted(WORKLOAD_KINDS))
def test_a_listed_kind_loads_as_its_model(name: str) -> None:
    doc = digits_job(workload={"name": name})
    assert type(validate_training_job(doc).spec.workload) is WORKLOAD_KINDS[name]


@pytest.mark.parametrize("name", sorted(WORKLOAD_KINDS))
def test_an_error_inside_a_kind_names_no_union_tag(name: str) -> None:
    with pytest.raises(UserInputError) as info:
        validate_training_job(digits_job(workload={"name": name, "steps": 0}))
    assert [e.path for e in info.value.errors] == ["spec.workload.steps"]


def test_the_worker_runs_every_listed_kind_and_no_other() -> None:
    assert set(worker.RUNNERS) == set(WORKLOAD_KINDS.values())


@pytest.mark.parametrize("name", sorted(WORKLOAD_KINDS))
def test_the_worker_dispatches_a_kind_to_its_runner(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[Any, JobContext]] = []
    for kind in list(worker.RUNNERS):  # a kind with no runner stays without one
        monkeypatch.setitem(worker.RUNNERS, kind, lambda w, ctx: ran.append((w, ctx)))
    monkeypatch.setattr(worker, "init_distributed", lambda: None)
    monkeypatch.setattr(worker, "shutdown_distributed", lambda **_: None)
    monkeypatch.setenv(ENV_WORKLOAD, json.dumps({"name": name, "steps": 7}))
    assert worker.main() == 0
    [(workload, _)] = ran
    assert type(workload) is WORKLOAD_KINDS[name]
    assert workload.steps == 7


def test_the_worker_refuses_an_unlisted_kind(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(worker, "init_distributed", lambda: None)
    monkeypatch.setattr(worker, "shutdown_distributed", lambda **_: None)
    monkeypatch.setenv(ENV_WORKLOAD, json.dumps({"name": "mnist"}))
    assert worker.main() == 2
    assert "unknown workload 'mnist'" in capsys.readouterr().err
