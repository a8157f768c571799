"""spec.topology: Kueue's topology request on the workers' pod template of every target Kueue
queues, required or preferred; refused where Kueue cannot honour it."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.errors import UserInputError
from gpufleet.kube import KUEUE_PREFERRED_TOPOLOGY, KUEUE_REQUIRED_TOPOLOGY, ROLE_WORKER
from gpufleet.render import FRAMEWORK_TARGETS, render
from gpufleet.spec import validate_training_job
from tests.support.specs import cluster_job

RACK = "topology.gpufleet.dev/rack"
KUEUE_TARGETS = [t for ts in FRAMEWORK_TARGETS.values() for t in ts if t != "volcano"]


def templates(obj: Any) -> list[dict[str, Any]]:
    """Every pod template (a dict with metadata and a spec holding containers) in ``obj``."""
    if isinstance(obj, dict):
        spec = obj.get("spec")
        own = [obj] if isinstance(spec, dict) and "containers" in spec else []
        return own + [t for v in obj.values() for t in templates(v)]
    if isinstance(obj, list):
        return [t for v in obj for t in templates(v)]
    return []


@pytest.mark.parametrize("target", KUEUE_TARGETS)
def test_every_kueue_target_asks_for_the_level_on_its_workers_only(target: str) -> None:
    doc = cluster_job(target, nodes=2, queue="llm", topology={"level": RACK})
    objects = render(validate_training_job(doc), target)
    found = {(t["metadata"]["labels"]["gpufleet.dev/role"],
              (t["metadata"].get("annotations") or {}).get(KUEUE_REQUIRED_TOPOLOGY))
             for o in objects for t in templates(o)}  # fmt: skip
    assert (ROLE_WORKER, RACK) in found
    assert all(level == RACK for role, level in found if role == ROLE_WORKER), found
    assert all(level is None for role, level in found if role != ROLE_WORKER), found


def test_preferred_is_kueues_preferred_annotation() -> None:
    doc = cluster_job(nodes=2, queue="llm", topology={"level": RACK, "required": False})
    (pod,) = templates(render(validate_training_job(doc), "jobset"))
    annotations = pod["metadata"]["annotations"]
    assert annotations[KUEUE_PREFERRED_TOPOLOGY] == RACK
    assert KUEUE_REQUIRED_TOPOLOGY not in annotations


@pytest.mark.parametrize(
    ("spec", "target", "why"),
    [
        ({"queue": "llm"}, "volcano", "target volcano is queued by Volcano"),
        ({}, "jobset", "needs spec.queue"),
    ],
)
def test_a_topology_kueue_cannot_honour_is_refused(
    spec: dict[str, Any], target: str, why: str
) -> None:
    doc = cluster_job(target, nodes=2, topology={"level": RACK}, **spec)
    with pytest.raises(UserInputError) as refused:
        render(validate_training_job(doc), target)
    assert [e.path for e in refused.value.errors] == ["spec.topology"]
    assert why in str(refused.value)


@pytest.mark.parametrize("level", ["kubernetes.io/hostname", RACK, "rack"])
def test_any_label_key_is_a_level(level: str) -> None:
    validate_training_job(cluster_job(topology={"level": level}))


@pytest.mark.parametrize("level", ["", "a b", "-rack", "x/"])
def test_a_level_that_is_no_label_key_is_refused_with_its_path(level: str) -> None:
    with pytest.raises(UserInputError) as refused:
        validate_training_job(cluster_job(topology={"level": level}))
    assert [e.path for e in refused.value.errors] == ["spec.topology.level"]
