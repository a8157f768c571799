"""The job ``gpufleet bench training`` runs: pure, from its config and a spec."""

from __future__ import annotations

from gpufleet.bench.jobs import base_job, bench_job, shared_results
from gpufleet.bench.training.config import TrainingConfig
from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec import TrainingJob

WORKER = "gpufleet.bench.training"


def with_parallelism(config: TrainingConfig, base: TrainingJob) -> TrainingJob:
    """``base`` with the strategy and precision ``config`` chooses (the spec's otherwise);
    its batch must split into the spec's gradient-accumulation micro-batches."""
    chosen = {"strategy": config.strategy, "mixed_precision": config.precision}
    parallelism = base.spec.parallelism.model_copy(
        update={k: v for k, v in chosen.items() if v is not None}
    )
    micro = parallelism.gradient_accumulation
    if config.batch_size % micro:
        raise UserInputError(
            [
                FieldError(
                    "--batch-size",
                    f"{config.batch_size} does not split "
                    f"into {micro} micro-batches (the spec's "
                    "parallelism.gradientAccumulation)",
                )
            ]
        )
    return base.model_copy(
        update={"spec": base.spec.model_copy(update={"parallelism": parallelism})}
    )


def publish_to(config: TrainingConfig, base: TrainingJob, *, rendered: bool) -> str:
    """Where the job publishes its runs: ``config.results``; rendered, by default the spec's
    shared checkpoint directory; else ``<outdir>/published``."""
    if config.results is None and rendered:
        shared = shared_results(base, "training")  # the shared volume or S3
        if shared is None:
            raise UserInputError(
                [
                    FieldError(
                        "--results",
                        "the rendered job needs somewhere "
                        "shared to write: set spec.checkpoint.dir or --results",
                    )
                ]
            )
        return shared
    return config.results or str(config.outdir / "published")


def plan(
    config: TrainingConfig,
    spec: TrainingJob | None,
    *,
    rendered: bool = False,
    cuda: bool = False,
) -> list[TrainingJob]:
    """One job timing ``config``'s runs on every node at once: ``spec``'s, or one on this
    machine when ``spec`` is None (a GPU per worker when ``cuda``). It publishes where
    ``publish_to`` says (give ``outdir`` absolute: the workers run elsewhere)."""
    base = with_parallelism(
        config, base_job(spec, nodes=config.nodes, procs=config.procs, cuda=cuda)
    )
    results = publish_to(config, base, rendered=rendered)
    args = [
        "--runs",
        str(config.timed_runs()),
        "--batch-size",
        str(config.batch_size),
        "--lr",
        str(config.lr),
        "--max-epochs",
        str(config.max_epochs),
        "--seed",
        str(config.seed),
        "--results",
        results,
    ]
    if spec is not None:  # the CLI names the spec's file
        args += ["--config-name", config.config_name]
    name = f"{base.metadata.name}-training" if spec is not None else "training"
    return [bench_job(base, name, WORKER, args, parallelism=True)]
