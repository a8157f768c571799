"""The job ``gpufleet bench coordinated`` runs: pure, from its config and a spec."""

from __future__ import annotations

from gpufleet.bench.coordinated.config import CoordinatedConfig
from gpufleet.bench.jobs import base_job, bench_job
from gpufleet.spec import TrainingJob

WORKER = "gpufleet.bench.coordinated"


def results_dir(config: CoordinatedConfig, spec: TrainingJob | None) -> str:
    """Where the nodes write: the spec's checkpoint volume (shared by the pods), else
    ``config.outdir`` (give it absolute: the workers run in their own directory)."""
    root = spec.spec.checkpoint.dir if spec is not None else None
    if root and "://" not in root:
        return f"{root.rstrip('/')}/coordinated"  # the shared volume
    return str(config.outdir)


def plan(
    config: CoordinatedConfig, spec: TrainingJob | None, *, cuda: bool = False
) -> list[TrainingJob]:
    """One job of a worker per node, each running LoadGen against its own URL: ``spec``'s, or
    one on this machine when ``spec`` is None (a GPU per node when ``cuda``)."""
    base = base_job(spec, nodes=config.node_count(), procs=1, cuda=cuda)
    args = [
        "--urls",
        ",".join(config.urls),
        "--model",
        config.model,
        "--scenario",
        config.scenario,
        "--latency-ms",
        str(config.latency_ms),
        "--duration",
        str(config.duration),
        "--outdir",
        results_dir(config, spec),
    ]
    if config.target_qps is not None:
        args += ["--target-qps", str(config.target_qps)]
    if config.quick:
        args.append("--quick")
    name = f"{base.metadata.name}-coordinated" if spec is not None else "coordinated"
    return [bench_job(base, name, WORKER, args)]
