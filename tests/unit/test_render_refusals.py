"""Specs a render target cannot run, refused with the field's path and why: what a pod needs
(an image, a checkpoint directory it mounts, GPUs that divide among its processes), a name the
target's controller cannot extend, what a TrainJob's runtime patches cannot carry, an elastic
node range on a target without one; and `gpufleet render` on the command line (exit 2 naming
the fields, a warning for a script not here, the files it writes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.errors import EXIT_BAD_INPUT, UserInputError
from gpufleet.render import FRAMEWORK_TARGETS, TARGETS, render
from gpufleet.spec import validate_training_job
from tests.support.specs import cluster_job, digits_job, write_spec

CANNOT_RUN: list[tuple[dict[str, Any], str]] = [
    ({"image": None}, "spec.image"),
    ({"checkpoint": {}}, "spec.checkpoint.dir"),
    ({"checkpoint": {"dir": "/elsewhere"}}, "spec.checkpoint.dir"),
    ({"resources": {"gpu": 3}, "procsPerNode": 2}, "spec.resources.gpu"),
]


@pytest.mark.parametrize(
    ("target", "spec", "want_path"),
    [
        (target, spec, path)
        for target in TARGETS
        for spec, path in CANNOT_RUN
        # a TensorFlow job (tfjob) runs one process per node: no GPUs to divide among several
        if target in FRAMEWORK_TARGETS["pytorch"] or "procsPerNode" not in spec
    ],
)
def test_specs_that_cannot_run_on_kubernetes(
    spec: dict[str, Any], want_path: str, target: str
) -> None:
    doc = cluster_job(target=target, **spec)
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}
    with pytest.raises(UserInputError) as info:
        render(validate_training_job(doc), target)
    assert want_path in [e.path for e in info.value.errors]


def test_cli_render_exit_2_with_field_paths(tmp_path: Path) -> None:
    path = write_spec(tmp_path, digits_job("train"))
    result = CliRunner().invoke(app, ["render", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "spec.image" in result.output and "spec.checkpoint.dir" in result.output
    bad_name = write_spec(tmp_path, cluster_job() | {"metadata": {"name": "Train_1"}}, "n.yaml")
    result = CliRunner().invoke(app, ["render", str(bad_name)])
    assert result.exit_code == EXIT_BAD_INPUT and "metadata.name" in result.output
    assert "DNS-1035" in result.output
    bad_target = CliRunner().invoke(app, ["render", str(path), "--target", "nope"])
    assert bad_target.exit_code == EXIT_BAD_INPUT and "--target" in bad_target.output


def test_cli_render_warns_of_a_script_missing_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that is not here renders (the image may hold it) with a warning naming it;
    one that is here renders silently. `gpufleet run` refuses the first (test_local_run)."""
    monkeypatch.chdir(tmp_path)
    path = write_spec(tmp_path, cluster_job(command=["train.py", "--lr", "0.1"], workload=None))
    result = CliRunner().invoke(app, ["render", str(path)])
    assert result.exit_code == 0, result.output
    assert "warning: spec.command[0]: train.py: no such file in" in result.output
    assert "the image must hold it" in result.output
    (tmp_path / "train.py").write_text("print(1)\n")
    result = CliRunner().invoke(app, ["render", str(path)])
    assert result.exit_code == 0 and "warning" not in result.output, result.output


def test_cli_render_writes_files(tmp_path: Path) -> None:
    path = write_spec(tmp_path, cluster_job())
    result = CliRunner().invoke(app, ["render", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["00-service-train.yaml", "01-job-train.yaml"]


@pytest.mark.parametrize("target", list(TARGETS))
def test_each_target_refuses_a_name_its_controller_cannot_extend(target: str) -> None:
    """The longest name a target takes renders; one more character is refused on metadata.name
    with the limit (the controllers append -worker-0-<i>-xxxxx and the like; the live test
    checks the limit against the JobSet webhook and the Job controller)."""
    from gpufleet.render.checks import name_limit

    limit = name_limit(target, 3)
    assert 40 <= limit < 63
    doc = cluster_job(target=target, nodes=3)
    doc["metadata"] = {"name": "a" * limit}
    assert render(validate_training_job(doc), target)
    doc["metadata"] = {"name": "a" * (limit + 1)}
    with pytest.raises(UserInputError) as refused:
        render(validate_training_job(doc), target)
    (error,) = refused.value.errors
    assert error.path == "metadata.name" and f"at most {limit} characters" in error.message


def test_a_name_starting_with_a_digit_is_refused_it_would_name_a_service() -> None:
    doc = cluster_job()
    doc["metadata"] = {"name": "1st-run"}
    with pytest.raises(UserInputError) as refused:
        validate_training_job(doc)
    assert "DNS-1035" in str(refused.value)


def test_a_trainjob_refuses_what_its_runtime_patches_cannot_carry() -> None:
    """Kubeflow Trainer v2.2's runtimePatches have no grace period and no container ports (its
    CRD refused both on the local control plane): a longer grace period than the runtime's
    30 s would cut the preemption checkpoint, a metrics port no PodMonitor could find."""
    doc = cluster_job(
        nodes=2, metrics={"port": 9090, "podMonitor": True}, preemption={"gracePeriod": "45s"}
    )
    with pytest.raises(UserInputError) as refused:
        render(validate_training_job(doc), "trainjob")
    errors = {e.path: e.message for e in refused.value.errors}
    assert set(errors) == {"spec.preemption.gracePeriod", "spec.metrics.port"}
    assert "45 s is longer than target trainjob's pods get" in errors["spec.preemption.gracePeriod"]
    assert "cannot declare the metrics container port" in errors["spec.metrics.port"]
    doc = cluster_job(nodes=2, preemption={"gracePeriod": "30s"})
    (trainjob,) = render(validate_training_job(doc), "trainjob")
    (patch,) = trainjob["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert set(pod) <= {"securityContext", "tolerations", "nodeSelector", "volumes", "containers"}
    assert set(pod["containers"][0]) <= {"name", "securityContext", "volumeMounts", "env"}


@pytest.mark.parametrize("target", ["trainjob", "mpijob", "volcano"])
def test_targets_without_an_elastic_range_refuse_min_nodes(target: str) -> None:
    job = validate_training_job(cluster_job(nodes=4, minNodes=2))
    with pytest.raises(UserInputError) as info:
        render(job, target)
    errors = {e.path: e.message for e in info.value.errors}
    assert errors["spec.minNodes"].startswith(f"target {target} has no elastic node range")
    assert info.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    ("target", "extra", "path", "start"),
    [
        ("jobset", {}, "spec.minNodes", "Kueue resizes no jobset (its elastic jobs"),
        ("pytorchjob", {}, "spec.minNodes", "Kueue resizes no pytorchjob"),
        ("job", {"topology": {"level": "kubernetes.io/hostname"}}, "spec.topology",
         "Kueue refuses a topology request on an elastic job"),
    ],
)  # fmt: skip
def test_a_queued_node_range_is_kueues_elastic_batch_job_alone(
    target: str, extra: dict[str, object], path: str, start: str
) -> None:
    job = validate_training_job(cluster_job(nodes=2, minNodes=1, queue="research", **extra))
    with pytest.raises(UserInputError) as info:
        render(job, target)
    errors = {e.path: e.message for e in info.value.errors}
    assert errors[path].startswith(start), errors
    assert info.value.exit_code == EXIT_BAD_INPUT
