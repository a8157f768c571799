"""The cross-field rules of a TrainingJob spec, word for word: each rule's field path and the
whole message a user reads (a changed or lost message is a worse error, and the mutation run
of spec/training_rules.py counts on these tests to notice one), and the inputs each rule must
leave alone (defaults, invalid values the field's own validation reports, other frameworks)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.spec.training_rules import framework_problems, parallelism_problems

COMMAND_REFUSED = (
    "applies to built-in workloads (spec.workload), not to a command: a script picks its own "
    "(gpufleet.runtime.Trainer(..., parallelism=ParallelismSettings(strategy='fsdp')), or its "
    "own fully_shard)"
)


@pytest.mark.parametrize(
    "parallelism",
    [
        {"strategy": "fsdp"},
        {"mixedPrecision": "bf16"},
        {"activationCheckpointing": True},
        {"gradientAccumulation": 2},
        {"strategy": "ddp", "someKeyNoModelHas": 1},  # unknown: set, its own error says what
    ],
)
def test_a_setting_with_a_command_is_refused_whole(parallelism: dict[str, Any]) -> None:
    got = parallelism_problems({"parallelism": parallelism}, has_command=True)
    assert got == [(("parallelism",), COMMAND_REFUSED)]


@pytest.mark.parametrize(
    "parallelism",
    [
        {"strategy": "ddp"},
        {"mixedPrecision": "fp32", "activationCheckpointing": False},
        {"gradientAccumulation": 1},
        {"strategy": "ddp", "mixedPrecision": "fp32", "activationCheckpointing": False,
         "gradientAccumulation": 1},
    ],
)  # fmt: skip
def test_defaults_with_a_command_set_nothing_and_pass(parallelism: dict[str, Any]) -> None:
    assert parallelism_problems({"parallelism": parallelism}, has_command=True) == []


@pytest.mark.parametrize("parallelism", [None, {}, "fsdp", ["fsdp"], 3])
def test_no_section_or_not_a_mapping_is_left_to_the_fields(parallelism: Any) -> None:
    data = {"parallelism": parallelism, "workload": {"name": "digits", "batchSize": 7}}
    assert parallelism_problems(data, has_command=True) == []
    assert parallelism_problems(data, has_command=False) == []


def accumulation(value: Any, workload: Any) -> list[Any]:
    data = {"parallelism": {"gradientAccumulation": value}, "workload": workload}
    return parallelism_problems(data, has_command=False)


def test_an_accumulation_that_does_not_divide_the_batch_is_refused_with_both_numbers() -> None:
    assert accumulation(3, {"name": "digits", "batchSize": 16}) == [
        (("parallelism", "gradientAccumulation"), "is 3, which does not divide "
         "spec.workload.batchSize 16: each micro-batch must have the same size")
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "default_batch"),
    [("digits", 5, 32), ("synthetic", 5, 64), ("digits", 3, 32), ("synthetic", 7, 64)],
)
def test_an_absent_batch_size_is_the_workloads_default(
    name: str, value: int, default_batch: int
) -> None:
    assert accumulation(value, {"name": name}) == [
        (("parallelism", "gradientAccumulation"), f"is {value}, which does not divide "
         f"spec.workload.batchSize {default_batch}: each micro-batch must have the same size")
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "workload"),
    [
        (4, {"name": "digits", "batchSize": 16}),  # divides
        (16, {"name": "digits", "batchSize": 16}),  # one sample per micro-batch
        (2, {"name": "digits"}),  # divides the default 32
        (8, {"name": "synthetic"}),  # divides the default 64
        (3, {"name": "nosuchworkload", "batchSize": 16}),  # the name's own error
        (3, "digits"),  # not a mapping: workload's own error
        (3, None),
        (0, {"name": "digits", "batchSize": 16}),  # below 1: the field's own error
        ("3", {"name": "digits", "batchSize": 16}),  # not an int: the field's own error
        (True, {"name": "digits", "batchSize": 16}),
        (3, {"name": "digits", "batchSize": 0}),  # the batch's own error
        (3, {"name": "digits", "batchSize": "16"}),
    ],
)
def test_what_the_accumulation_rule_leaves_to_other_checks(value: Any, workload: Any) -> None:
    assert accumulation(value, workload) == []


def test_a_batch_of_one_cannot_be_accumulated() -> None:
    assert accumulation(2, {"name": "digits", "batchSize": 1}) == [
        (("parallelism", "gradientAccumulation"), "is 2, which does not divide "
         "spec.workload.batchSize 1: each micro-batch must have the same size")
    ]  # fmt: skip


def test_an_absent_accumulation_is_one() -> None:
    data = {"parallelism": {"strategy": "fsdp"}, "workload": {"name": "digits", "batchSize": 7}}
    assert parallelism_problems(data, has_command=False) == []


@pytest.mark.parametrize("framework", [None, "pytorch", "jax", 3, ["tensorflow"]])
def test_pytorch_and_unknown_frameworks_have_no_framework_rules(framework: Any) -> None:
    data = {"framework": framework, "procsPerNode": 4, "minNodes": 1, "onNonFinite": "rollback",
            "parallelism": {"strategy": "fsdp"}, "workload": {"name": "synthetic"},
            "metrics": {"port": 9400},
            "checkpoint": {"dir": "s3://b/x", "async": True}}  # fmt: skip
    assert framework_problems(data) == []


TF = "spec.framework tensorflow"
RAY = "spec.framework ray"


def test_every_tensorflow_rule_at_once_in_order() -> None:
    data = {"framework": "tensorflow", "procsPerNode": 4, "workload": {"name": "synthetic"},
            "parallelism": {"mixedPrecision": "bf16"}, "minNodes": 1,
            "onNonFinite": "rollback", "metrics": {"port": 9400}}  # fmt: skip
    assert framework_problems(data) == [
        (("procsPerNode",), f"is 4, but {TF} runs one worker per node "
         "(MultiWorkerMirroredStrategy uses all of a node's GPUs in it): set 1"),
        (("workload", "name"), f"'synthetic' has no tensorflow version; {TF} has: digits"),
        (("parallelism",), f"is PyTorch's (DDP/FSDP2, bf16, accumulation); {TF} replicates "
         "the model on every GPU (MultiWorkerMirroredStrategy): remove it"),
        (("minNodes",), f"elastic world sizes are torchrun's; {TF} runs on a fixed number of "
         "workers: remove it"),
        (("onNonFinite",), f"rollback is the PyTorch Trainer's; {TF} stops at a NaN/Inf loss "
         "(fail)"),
    ]  # fmt: skip


def test_every_ray_rule_at_once_in_order() -> None:
    data = {"framework": "ray", "procsPerNode": 4, "workload": {"name": "synthetic"},
            "parallelism": {"gradientAccumulation": 2}, "minNodes": 0,
            "onNonFinite": "rollback", "metrics": {"port": 9400}}  # fmt: skip
    assert framework_problems(data) == [
        (("workload", "name"), f"'synthetic' has no ray version; {RAY} has: digits"),
        (("parallelism",), f"is PyTorch's (DDP/FSDP2, bf16, accumulation); {RAY} replicates "
         "the model on every worker (Ray Train's DDP): remove it"),
        (("minNodes",), f"elastic world sizes are torchrun's; {RAY} runs on a fixed number of "
         "workers: remove it"),
        (("onNonFinite",), f"rollback is the PyTorch Trainer's; {RAY} stops at a NaN/Inf loss "
         "(fail)"),
        (("metrics", "port"), "gpufleet's job metrics come from its launcher, which "
         f"{RAY} does not run; Ray exports its own (ray start's --metrics-export-port, "
         "8080 under KubeRay): remove it"),
    ]  # fmt: skip


@pytest.mark.parametrize("framework", ["tensorflow", "ray"])
def test_what_each_framework_accepts(framework: str) -> None:
    data = {"framework": framework, "procsPerNode": 1, "workload": {"name": "digits"},
            "parallelism": {"strategy": "ddp", "gradientAccumulation": 1}, "minNodes": None,
            "onNonFinite": "fail", "metrics": {"port": 0}}  # fmt: skip
    assert framework_problems(data) == []


@pytest.mark.parametrize(
    "data",
    [
        {"procsPerNode": 0},  # below 1: the field's own error
        {"procsPerNode": "4"},
        {"workload": {"name": "nosuchworkload"}},  # the name's own error
        {"workload": "synthetic"},
        {"parallelism": "fsdp"},
        {"parallelism": {}},
        {"metrics": "9400"},
        {"metrics": {"port": None}},
        {"onNonFinite": "skip"},
    ],
)
def test_tensorflow_leaves_invalid_or_harmless_values_to_the_fields(data: dict[str, Any]) -> None:
    assert framework_problems({"framework": "tensorflow", **data}) == []


def test_ray_may_run_several_processes_per_node_and_tensorflow_exports_metrics() -> None:
    assert framework_problems({"framework": "ray", "procsPerNode": 4}) == []
    assert framework_problems({"framework": "tensorflow", "metrics": {"port": 9400}}) == []
