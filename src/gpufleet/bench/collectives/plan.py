"""The job ``gpufleet bench collectives`` runs: pure, from its config and a spec."""

from __future__ import annotations

from gpufleet.bench.collectives.config import CollectivesConfig
from gpufleet.bench.jobs import base_job, bench_job, shared_results
from gpufleet.spec import TrainingJob

WORKER = "gpufleet.bench.collectives"


def plan(
    config: CollectivesConfig,
    spec: TrainingJob | None,
    *,
    rendered: bool = False,
    cuda: bool = False,
) -> list[TrainingJob]:
    """One job sweeping ``config``'s ops and sizes: ``spec``'s (its command replaced), or one
    on this machine when ``spec`` is None (a GPU per worker when ``cuda``). A ``rendered`` job
    publishes its result to the spec's shared checkpoint directory."""
    base = base_job(spec, nodes=config.nodes, procs=config.procs, cuda=cuda)
    args = [
        "--ops",
        ",".join(config.ops),
        "--min-bytes",
        str(config.min_bytes),
        "--max-bytes",
        str(config.top()),
    ]
    if config.quick:
        min_seconds, max_iters = config.timing()
        args += ["--min-seconds", str(min_seconds), "--max-iters", str(max_iters)]
    shared = shared_results(base, "collectives") if rendered else None
    if shared:
        args += ["--results", shared]
    name = f"{base.metadata.name}-collectives" if spec is not None else "collectives"
    return [bench_job(base, name, WORKER, args)]
