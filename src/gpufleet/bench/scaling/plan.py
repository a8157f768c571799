"""The jobs ``gpufleet bench scaling`` runs, one per (mode, world size): pure, from its config
and a spec."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.bench.jobs import bench_job, local_job, shared_results
from gpufleet.bench.scaling.config import MODES, ScalingConfig
from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec import TrainingJob

WORKER = "gpufleet.bench.scaling"


@dataclass(frozen=True)
class PointJob:
    """One planned point: its mode, world size, nodes, and the job that measures it."""

    mode: str
    workers: int
    nodes: int
    job: TrainingJob


def point_base(spec: TrainingJob | None, nodes: int, procs: int) -> TrainingJob:
    """The job one point starts from: ``spec`` resized (its GPUs, if any, one per worker), or
    a CPU job on this machine."""
    if spec is None:
        return local_job("scaling", nodes=nodes, procs_per_node=procs, gpus=0)
    gpus = spec.spec.resources.gpu and procs
    update = {
        "nodes": nodes,
        "procs_per_node": procs,
        "min_nodes": None,
        "resources": spec.spec.resources.model_copy(update={"gpu": gpus}),
    }
    return spec.model_copy(update={"spec": spec.spec.model_copy(update=update)})


def plan_points(
    config: ScalingConfig, spec: TrainingJob | None, *, rendered: bool = False
) -> list[PointJob]:
    """Every point of ``config``, mode by mode: a world size above the workers per node
    (``per_node``, else the spec's procsPerNode, else all on one) spans whole nodes. The
    widest also times all-reduce for the fit; ``rendered`` points publish to the spec's
    shared checkpoint directory."""
    sizes = config.workers
    per_node = config.per_node or (spec.spec.procs_per_node if spec else max(sizes))
    for n in sizes:
        if n > per_node and n % per_node:
            raise UserInputError(
                [
                    FieldError(
                        "--workers",
                        f"{n} workers do not fill whole nodes of {per_node} (--per-node)",
                    )
                ]
            )
    args = config.worker_args()
    shared = shared_results(spec, "scaling") if spec is not None and rendered else None
    if shared:
        args += ["--results", shared]
    prefix = f"{spec.metadata.name}-" if spec is not None else ""
    points = []
    for mode in MODES[config.mode]:
        for n in sizes:
            nodes, procs = (1, n) if n <= per_node else (n // per_node, per_node)
            fit = ["--fit"] if n == max(sizes) else []
            job = bench_job(
                point_base(spec, nodes, procs),
                f"{prefix}scaling-{mode}-{n}",
                WORKER,
                [*args, "--mode", mode, *fit],
            )
            points.append(PointJob(mode, n, nodes, job))
    return points


def plan(
    config: ScalingConfig, spec: TrainingJob | None, *, rendered: bool = False
) -> list[TrainingJob]:
    """The jobs of ``plan_points``, in order."""
    return [p.job for p in plan_points(config, spec, rendered=rendered)]
