"""Spec builders: small TrainingJob documents, written as YAML, and the pod templates inside what
the renderers make of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpufleet.render import FRAMEWORK_TARGETS


def digits_job(name: str = "digits-test", **spec: Any) -> dict[str, Any]:
    """A small digits TrainingJob document; ``spec`` keys override (camelCase)."""
    doc: dict[str, Any] = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workload": {"name": "digits", "steps": 40, "batchSize": 32, "logEvery": 5},
            "nodes": 1,
            "procsPerNode": 2,
            "checkpoint": {"everySteps": 10, "keep": 3},
            "maxRestarts": 2,
            "hangTimeout": "60s",
            "preemption": {"gracePeriod": "20s"},
        },
    }
    doc["spec"].update(spec)
    return doc


def cluster_job(target: str | None = None, **spec: Any) -> dict[str, Any]:
    """A digits job named "train" that can run on a cluster (image, checkpoints on a volume);
    with ``target``, of a framework that target runs (a TensorFlow job for tfjob, a Ray job
    for rayjob: one process per node, nothing PyTorch's alone), so a test of every target
    renders each one. A Horovod job (framework="horovod") runs a script instead."""
    base: dict[str, Any] = {
        "image": "ghcr.io/example/gpufleet:0.1.0",
        "checkpoint": {"dir": "/ckpt/run", "everySteps": 50},
        "volumes": [{"name": "ckpt", "mountPath": "/ckpt", "claimName": "team-ckpt"}],
    }
    base.update(spec)
    doc = digits_job("train", **base)
    if target is not None and target not in FRAMEWORK_TARGETS["pytorch"]:
        s = doc["spec"]
        framework = next(f for f, targets in FRAMEWORK_TARGETS.items() if target in targets)
        s.update(framework=framework, procsPerNode=1)
        for key in ("parallelism", "minNodes"):
            s.pop(key, None)
        if isinstance(s.get("checkpoint"), dict):
            s["checkpoint"].pop("async", None)
        if framework == "ray":
            s.pop("metrics", None)  # Ray exports its own metrics (training_rules)
    if doc["spec"].get("framework") == "horovod":  # a Horovod script, no built-in workload
        doc["spec"].pop("workload")
        doc["spec"].setdefault("command", ["train.py", "--epochs", "3"])
    return doc


def write_spec(directory: Path, doc: dict[str, Any], filename: str = "job.yaml") -> Path:
    """Write a spec document as YAML and return its path."""
    path = directory / filename
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pod_templates(obj: Any) -> Iterator[dict[str, Any]]:
    """Every pod template inside a rendered object (Job, JobSet, Kubeflow and Volcano kinds)."""
    if isinstance(obj, dict):
        template = obj.get("template")
        if isinstance(template, dict) and "containers" in template.get("spec", {}):
            yield template
        for value in obj.values():
            yield from pod_templates(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from pod_templates(value)
