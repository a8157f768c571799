"""The spec loader: valid documents load, every bad one yields all errors with field paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.errors import EXIT_BAD_INPUT, UserInputError
from gpufleet.spec import load_spec, load_training_job, parse_override, validate_training_job
from gpufleet.spec.units import parse_duration, parse_quantity
from tests.support.specs import digits_job, write_spec


def errors_of(doc: Any) -> dict[str, str]:
    with pytest.raises(UserInputError) as info:
        validate_training_job(doc)
    assert info.value.exit_code == EXIT_BAD_INPUT
    return {e.path: e.message for e in info.value.errors}


def test_example_specs_load() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    specs = sorted(root.glob("*.yaml"))
    assert specs
    kinds = set()
    for path in specs:
        spec = load_spec(path)
        assert spec.metadata.name
        kinds.add(spec.kind)
    assert kinds == {"TrainingJob", "InferenceService"}
    with pytest.raises(UserInputError, match="expected a TrainingJob"):
        load_training_job(root / "digits-serving.yaml")


def test_defaults() -> None:
    job = validate_training_job(digits_job(checkpoint={}, maxRestarts=3))
    s = job.spec
    assert (s.checkpoint.every_steps, s.checkpoint.keep, s.checkpoint.async_save) == (50, 3, False)
    assert s.world_size == 2
    assert s.preemption.grace_period == 20.0


@pytest.mark.parametrize(
    ("spec", "want_path", "want_text"),
    [
        ({"nodes": 0}, "spec.nodes", "greater than or equal to 1"),
        ({"procsPerNode": -2}, "spec.procsPerNode", "got -2"),
        ({"nodes": "two"}, "spec.nodes", "valid integer"),
        ({"maxRestarts": -1}, "spec.maxRestarts", "greater than or equal to 0"),
        ({"hangTimeout": "soon"}, "spec.hangTimeout", "duration"),
        ({"hangTimeout": -5}, "spec.hangTimeout", "non-negative"),
        ({"procPerNode": 2}, "spec.procPerNode", "did you mean 'procsPerNode'"),
        ({"checkpoint": {"keep": 0}}, "spec.checkpoint.keep", "greater than or equal to 1"),
        ({"checkpoint": {"everySteps": 1.5}}, "spec.checkpoint.everySteps", "integer"),
        ({"env": {"1BAD": "x"}}, "spec.env", "invalid environment variable"),
        ({"env": {"FLAG": True}}, "spec.env.FLAG", "string"),
        ({"resources": {"memory": "lots"}}, "spec.resources.memory", "quantity"),
        ({"resources": {"gpu": 1}, "procsPerNode": 2}, "spec.procsPerNode", "is 2 but"),
        ({"workload": {"name": "mnist"}}, "spec.workload", "'mnist'"),
        ({"workload": {"name": "digits", "steps": 0}}, "spec.workload.steps", ">= 1"),
        ({"workload": None}, "spec.command", "set either spec.command"),
        ({"command": []}, "spec.command", "empty command"),
        ({"command": ["-m"]}, "spec.command", "module name"),
        (
            {"command": ["python", "t.py", "-x"], "workload": None},
            "spec.command",
            "write command: ['t.py', '-x']",
        ),
        (
            {"command": ["/usr/bin/python3.11", "-m", "pkg"], "workload": None},
            "spec.command",
            "write command: ['-m', 'pkg']",
        ),
        (
            {"command": ["torchrun", "--nproc-per-node=2", "t.py"], "workload": None},
            "spec.command",
            "write command: ['t.py']",
        ),
        (
            {"command": ["python", "-c", "print(1)"], "workload": None},
            "spec.command",
            "starts with 'python'",
        ),
        ({"command": ["t.py"]}, "spec.workload", "exclusive"),
        (
            {"volumes": [{"name": "d", "mountPath": "rel", "claimName": "c"}]},
            "spec.volumes[0].mountPath",
            "absolute",
        ),
        ({"image": 3}, "spec.image", "valid string"),
        ({"onNonFinite": "skip"}, "spec.onNonFinite", "'fail' or 'rollback'"),
        ({"parallelism": {"strategy": "zero3"}}, "spec.parallelism.strategy", "'ddp' or 'fsdp'"),
        (
            {"parallelism": {"mixedPrecision": "fp16"}},
            "spec.parallelism.mixedPrecision",
            "'fp32' or 'bf16'",
        ),
        (
            {"parallelism": {"gradientAccumulation": 0}},
            "spec.parallelism.gradientAccumulation",
            ">= 1",
        ),
        (
            {"parallelism": {"gradientAccumulation": 3}},
            "spec.parallelism.gradientAccumulation",
            "is 3, which does not divide spec.workload.batchSize 32",
        ),
        ({"nodes": 2, "minNodes": 3}, "spec.minNodes", "is 3, more than spec.nodes 2"),
        ({"minNodes": 0}, "spec.minNodes", ">= 1"),
        (
            {"parallelism": {"strategy": "fsdp"}, "command": ["t.py"], "workload": None},
            "spec.parallelism",
            "applies to built-in workloads (spec.workload), not to a command",
        ),
    ],
)
def test_bad_spec_field_paths(spec: dict[str, Any], want_path: str, want_text: str) -> None:
    errs = errors_of(digits_job(**spec))
    assert want_path in errs, errs
    assert want_text.replace(">= 1", "greater than or equal to 1") in errs[want_path]


def test_a_command_job_dump_validates_back() -> None:
    """A default is never an error: a command job's own dump (which writes every default,
    parallelism's among them, as `gpufleet validate -o json` prints it) validates back to the
    same job; a parallelism setting other than the default is still refused."""
    job = validate_training_job(digits_job(command=["t.py"], workload=None))
    dump = job.model_dump(mode="json", by_alias=True)
    assert dump["spec"]["parallelism"]  # the defaults are written
    assert validate_training_job(dump) == job
    dump["spec"]["parallelism"]["activationCheckpointing"] = True
    assert "spec.parallelism" in errors_of(dump)


def test_all_errors_reported_at_once() -> None:
    doc = digits_job(nodes=0, procsPerNode=0, maxRestarts=-1)
    doc["metadata"]["name"] = "Not_A_Label"
    doc["kind"] = "Job"
    errs = errors_of(doc)
    assert {"spec.nodes", "spec.procsPerNode", "spec.maxRestarts", "metadata.name", "kind"} <= set(
        errs
    )


def test_missing_top_level_fields() -> None:
    errs = errors_of({"kind": "TrainingJob"})
    assert errs["apiVersion"] == "required field is missing"
    assert errs["metadata"] == "required field is missing"


def test_errors_carry_yaml_lines(tmp_path: Path) -> None:
    text = (
        "apiVersion: gpufleet.dev/v1alpha1\n"
        "kind: TrainingJob\n"
        "metadata:\n"
        "  name: ok\n"
        "spec:\n"
        "  workload: {name: digits}\n"
        "  nodes: 0\n"
        "  bogus: 1\n"
    )
    path = tmp_path / "j.yaml"
    path.write_text(text)
    with pytest.raises(UserInputError) as info:
        load_training_job(path)
    by_path = {e.path: e.line for e in info.value.errors}
    assert by_path == {"spec.nodes": 7, "spec.bogus": 8}
    assert "spec.nodes (line 7)" in str(info.value)


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (b"", "is empty"),
        (b"a: [1, 2\n", "not valid YAML"),
        (b"- just\n- a list\n", "expected a mapping"),
        (b"a: 1\n---\nb: 2\n", "2 YAML documents"),
        (b"\xff\xfe\x00bad", "not UTF-8"),
        (b"key: !!python/object:os.system x\n", "not valid YAML"),
    ],
)
def test_unparseable_files(tmp_path: Path, content: bytes, want: str) -> None:
    path = tmp_path / "j.yaml"
    path.write_bytes(content)
    with pytest.raises(UserInputError) as info:
        load_training_job(path)
    assert want in str(info.value)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="file not found"):
        load_training_job(tmp_path / "nope.yaml")
    with pytest.raises(UserInputError, match="is a directory"):
        load_training_job(tmp_path)


def test_overrides(tmp_path: Path) -> None:
    path = write_spec(tmp_path, digits_job())
    job = load_training_job(
        path, ["spec.nodes=2", "spec.procsPerNode=1", "spec.env.MODE=fast", "spec.workload.lr=0.1"]
    )
    assert (job.spec.nodes, job.spec.procs_per_node) == (2, 1)
    assert job.spec.env == {"MODE": "fast"}
    assert job.spec.workload is not None and job.spec.workload.lr == 0.1


def test_override_errors_name_the_field(tmp_path: Path) -> None:
    path = write_spec(tmp_path, digits_job())
    with pytest.raises(UserInputError) as info:
        load_training_job(path, ["spec.nodes=-1"])
    (err,) = info.value.errors
    assert (err.path, err.line) == ("spec.nodes", None)
    with pytest.raises(UserInputError, match="key=value"):
        load_training_job(path, ["spec.nodes"])
    with pytest.raises(UserInputError, match="no such list item"):
        load_training_job(path, ["spec.volumes[3]=x"])


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("spec.nodes=2", (("spec", "nodes"), 2)),
        ("spec.command[1]=x", (("spec", "command", 1), "x")),
        ("a.b=[1, 2]", (("a", "b"), [1, 2])),
        ("a=", (("a",), "")),
    ],
)
def test_parse_override(text: str, want: tuple[Any, Any]) -> None:
    assert parse_override(text) == want


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        ("45s", 45.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("2.5", 2.5),
        ("500us", 0.0005),
    ],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "5x", "m5", True, None, [1], "-3s"])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value", [2, "500m", "4Gi", "1.5", "1e3"])
def test_quantities(value: object) -> None:
    assert parse_quantity(value) == str(value)


def test_cluster_only_fields_listed() -> None:
    doc = digits_job(image="ghcr.io/x/y:1", queue="team-a")
    assert validate_training_job(doc).spec.cluster_only_fields() == ["image", "queue"]


def test_spec_round_trips_through_yaml(tmp_path: Path) -> None:
    job = validate_training_job(digits_job(env={"A": "1"}))
    dumped = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    again = validate_training_job(yaml.safe_load(yaml.safe_dump(dumped)))
    assert again == job


def test_cross_field_problems_each_have_their_own_path_and_come_with_field_errors() -> None:
    """Two cross-field problems and a field error in one document: three errors, three paths
    (not one at `spec` joined by '; ')."""
    doc = digits_job(nodes=0, procsPerNode=4, resources={"gpu": 2}, command=["t.py"])
    errs = errors_of(doc)
    assert errs["spec.nodes"].startswith("Input should be greater than or equal to 1")
    assert errs["spec.procsPerNode"].startswith("is 4 but spec.resources.gpu is 2")
    assert errs["spec.workload"].startswith("exclusive with spec.command")
    assert "spec" not in errs and not any("; " in m for m in errs.values())


def test_serving_cross_field_problems_each_have_their_own_path() -> None:
    from gpufleet.spec import validate_spec

    doc = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "svc"},
        "spec": {
            "model": {"name": "m"},
            "replicas": {"min": 3, "max": 2},
            "batching": {"maxBatchSize": 8},
        },
    }
    with pytest.raises(UserInputError) as info:
        validate_spec(doc)
    paths = sorted(e.path for e in info.value.errors)
    assert paths == [
        "spec.batching.preferredBatchSizes",  # the default sizes 16, 32, 64 exceed 8
        "spec.model.repository",
        "spec.replicas.max",
    ]


def test_a_typo_in_an_inference_service_suggests_its_own_fields() -> None:
    from gpufleet.spec import validate_spec

    doc = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "svc"},
        "spec": {"model": {"name": "m", "repository": "s3://b/m"}, "replics": {"min": 1}},
    }
    with pytest.raises(UserInputError) as info:
        validate_spec(doc)
    (error,) = info.value.errors
    assert error.path == "spec.replics"
    assert "did you mean 'replicas'?" in error.message and "checkpoint" not in error.message


def test_parallelism_reaches_the_workers_only_when_set() -> None:
    from gpufleet.launch.worker import job_context
    from gpufleet.runtime.context import ENV_PARALLELISM, JobContext, ParallelismSettings

    plain = job_context(validate_training_job(digits_job()), Path("/r")).to_env()
    assert ENV_PARALLELISM not in plain  # a job without it renders as before
    wanted = {"strategy": "fsdp", "mixedPrecision": "bf16", "activationCheckpointing": True,
              "gradientAccumulation": 4}  # fmt: skip
    doc = digits_job(parallelism=wanted)
    env = job_context(validate_training_job(doc), Path("/r")).to_env()
    assert JobContext.from_env(env).parallelism == ParallelismSettings(
        strategy="fsdp", mixed_precision="bf16", activation_checkpointing=True,
        gradient_accumulation=4)  # fmt: skip


def test_cross_field_rules_use_defaults_for_absent_sections() -> None:
    """procsPerNode 2 with resources.gpu 1 is caught whether or not other sections are set, and
    an absent resources section means gpu 0 (no rule)."""
    from gpufleet.spec.validation import raw_int

    assert raw_int({}, "resources", "gpu", default=0) == 0
    assert raw_int({"resources": {}}, "resources", "gpu", default=7) == 7
    assert raw_int({"resources": "x"}, "resources", "gpu", default=0) is None
    assert raw_int({"resources": {"gpu": True}}, "resources", "gpu", default=0) is None
    assert "spec.procsPerNode" in errors_of(digits_job(procsPerNode=2, resources={"gpu": 1}))
    assert validate_training_job(digits_job(procsPerNode=2)).spec.procs_per_node == 2
