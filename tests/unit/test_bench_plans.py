"""Each benchmark's pure plan(config, spec): the jobs it would run, built without running
anything, checked field by field (what runs them: tests/integration/test_bench.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.bench.collectives import CollectivesConfig
from gpufleet.bench.collectives import plan as plan_collectives
from gpufleet.bench.coordinated import CoordinatedConfig
from gpufleet.bench.coordinated import plan as plan_coordinated
from gpufleet.bench.scaling import ScalingConfig, plan_points
from gpufleet.bench.training import TrainingConfig
from gpufleet.bench.training import plan as plan_training
from gpufleet.errors import UserInputError
from gpufleet.spec import TrainingJob, validate_training_job
from tests.support.specs import cluster_job


def spec(**fields: Any) -> TrainingJob:
    """The tests' cluster job ("train": an image, checkpoints on a volume), with ``fields``."""
    return validate_training_job(cluster_job(**fields))


def option_value(job: TrainingJob, option: str) -> str:
    command = job.spec.command
    return command[command.index(option) + 1]


def test_collectives_runs_here_with_every_op_and_the_default_sizes() -> None:
    (job,) = plan_collectives(CollectivesConfig(), None)
    assert job.metadata.name == "collectives"
    assert job.spec.command == [
        "-m",
        "gpufleet.bench.collectives",
        "--ops",
        "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all",
        "--min-bytes",
        "8",
        "--max-bytes",
        str(1 << 30),
    ]
    assert (job.spec.nodes, job.spec.procs_per_node, job.spec.resources.gpu) == (1, 2, 0)
    assert job.spec.max_restarts == 0 and job.spec.hang_timeout == 0.0
    assert job.spec.workload is None and job.spec.image is None


def test_a_quick_collectives_sweep_stops_at_1_mib_and_a_gpu_machine_gives_each_worker_one() -> None:
    config = CollectivesConfig(procs=4, nodes=2, ops=("all_reduce",), quick=True)
    (job,) = plan_collectives(config, None, cuda=True)
    assert job.spec.command[2:] == [
        "--ops",
        "all_reduce",
        "--min-bytes",
        "8",
        "--max-bytes",
        str(1 << 20),
        "--min-seconds",
        "0.02",
        "--max-iters",
        "5",
    ]
    assert (job.spec.nodes, job.spec.procs_per_node, job.spec.resources.gpu) == (2, 4, 4)


def test_a_rendered_collectives_job_is_the_specs_and_publishes_to_its_volume() -> None:
    (job,) = plan_collectives(CollectivesConfig(), spec(nodes=3), rendered=True)
    assert job.metadata.name == "train-collectives" and job.spec.nodes == 3
    assert job.spec.image == "ghcr.io/example/gpufleet:0.1.0"
    assert option_value(job, "--results") == "/ckpt/run/bench-collectives"
    (here,) = plan_collectives(CollectivesConfig(), spec(nodes=3))
    assert "--results" not in here.spec.command


def test_collectives_name_the_cli_option_of_a_bad_local_size() -> None:
    with pytest.raises(UserInputError) as exc:
        plan_collectives(CollectivesConfig(procs=0), None)
    assert [e.path for e in exc.value.errors] == ["--procs"]
    with pytest.raises(UserInputError) as bad:
        CollectivesConfig.parse(
            procs=2,
            nodes=1,
            ops="all_reduce",
            min_bytes="2MiB",
            max_bytes="1MiB",
            quick=False,
            outdir=Path("x"),
        )
    assert [e.path for e in bad.value.errors] == ["--min-bytes"]


def test_scaling_plans_one_job_per_mode_and_world_size_the_widest_fitting_the_link() -> None:
    points = plan_points(ScalingConfig(workers=(1, 2, 4), per_node=2), None)
    assert [(p.mode, p.workers, p.nodes) for p in points] == [
        ("strong", 1, 1),
        ("strong", 2, 1),
        ("strong", 4, 2),
        ("weak", 1, 1),
        ("weak", 2, 1),
        ("weak", 4, 2),
    ]
    widest = points[2].job
    assert widest.metadata.name == "scaling-strong-4"
    assert (widest.spec.nodes, widest.spec.procs_per_node, widest.spec.resources.gpu) == (2, 2, 0)
    assert widest.spec.command == [
        "-m",
        "gpufleet.bench.scaling",
        "--batch",
        "256",
        "--steps",
        "20",
        "--warmup",
        "4",
        "--mode",
        "strong",
        "--fit",
    ]
    assert "--fit" not in points[1].job.spec.command
    assert option_value(points[3].job, "--mode") == "weak"


def test_quick_scaling_trains_a_small_model_for_few_steps() -> None:
    (point,) = plan_points(ScalingConfig(workers=(1,), mode="weak", quick=True), None)
    assert point.job.spec.command[2:] == [
        "--batch",
        "256",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--input-size",
        "64",
        "--hidden-size",
        "256",
        "--layers",
        "2",
        "--mode",
        "weak",
        "--fit",
    ]


def test_rendered_scaling_points_resize_the_spec_and_publish_to_its_volume() -> None:
    base = spec(procsPerNode=2, resources={"gpu": 2})
    points = plan_points(ScalingConfig(workers=(1, 4), mode="weak"), base, rendered=True)
    one, four = (p.job for p in points)
    assert (
        one.metadata.name == "train-scaling-weak-1" and four.metadata.name == "train-scaling-weak-4"
    )
    assert (one.spec.nodes, one.spec.procs_per_node, one.spec.resources.gpu) == (1, 1, 1)
    assert (four.spec.nodes, four.spec.procs_per_node, four.spec.resources.gpu) == (2, 2, 2)
    assert option_value(four, "--results") == "/ckpt/run/bench-scaling"


def test_scaling_refuses_world_sizes_that_do_not_fill_whole_nodes() -> None:
    with pytest.raises(UserInputError) as exc:
        plan_points(ScalingConfig(workers=(1, 3), per_node=2), None)
    assert [e.path for e in exc.value.errors] == ["--workers"]


def test_coordinated_runs_one_worker_per_node_with_loadgens_defaults() -> None:
    config = CoordinatedConfig(urls=("a:1", "b:2"), model="m", outdir=Path("/out"))
    (job,) = plan_coordinated(config, None)
    assert job.metadata.name == "coordinated"
    assert (job.spec.nodes, job.spec.procs_per_node) == (2, 1)
    assert job.spec.command == [
        "-m",
        "gpufleet.bench.coordinated",
        "--urls",
        "a:1,b:2",
        "--model",
        "m",
        "--scenario",
        "Offline",
        "--latency-ms",
        "100.0",
        "--duration",
        "60.0",
        "--outdir",
        "/out",
    ]


def test_coordinated_on_a_spec_writes_to_its_volume_and_passes_the_rate() -> None:
    config = CoordinatedConfig(
        urls=("a:1",), model="m", scenario="Server", target_qps=5.0, nodes=3, quick=True
    )
    (job,) = plan_coordinated(config, spec())
    assert job.metadata.name == "train-coordinated" and job.spec.nodes == 1  # the spec's
    assert option_value(job, "--outdir") == "/ckpt/run/coordinated"
    assert option_value(job, "--target-qps") == "5.0" and job.spec.command[-1] == "--quick"


def test_training_runs_here_publishing_under_outdir_with_the_chosen_parallelism() -> None:
    config = TrainingConfig(strategy="fsdp", precision="bf16", outdir=Path("/out"), quick=True)
    (job,) = plan_training(config, None)
    assert job.metadata.name == "training"
    assert job.spec.command == [
        "-m",
        "gpufleet.bench.training",
        "--runs",
        "1",
        "--batch-size",
        "32",
        "--lr",
        "0.05",
        "--max-epochs",
        "40",
        "--seed",
        "0",
        "--results",
        "/out/published",
    ]
    assert job.spec.parallelism.strategy == "fsdp"
    assert job.spec.parallelism.mixed_precision == "bf16"
    assert (job.spec.nodes, job.spec.procs_per_node) == (1, 2)


def test_rendered_training_publishes_to_the_specs_volume_and_names_its_file() -> None:
    config = TrainingConfig(config_name="train.yaml")
    (job,) = plan_training(config, spec(), rendered=True)
    assert job.metadata.name == "train-training"
    assert option_value(job, "--results") == "/ckpt/run/bench-training"
    assert option_value(job, "--runs") == "5"
    assert option_value(job, "--config-name") == "train.yaml"


def test_rendered_training_needs_somewhere_shared_and_a_batch_the_micro_batches_split() -> None:
    no_volume = spec(checkpoint={"dir": None}, volumes=[])
    with pytest.raises(UserInputError) as exc:
        plan_training(TrainingConfig(), no_volume, rendered=True)
    assert [e.path for e in exc.value.errors] == ["--results"]
    accumulating = spec(parallelism={"gradientAccumulation": 2})
    with pytest.raises(UserInputError) as split:
        plan_training(TrainingConfig(batch_size=33), accumulating)
    assert [e.path for e in split.value.errors] == ["--batch-size"]
