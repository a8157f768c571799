"""``gpufleet bench collectives`` end to end: plan, then render the job or run it here, then
report. The edge: it probes memory and GPUs, starts workers and writes files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpufleet.bench import runner
from gpufleet.bench.collectives.config import CollectivesConfig
from gpufleet.bench.collectives.ops import human_bytes, sweep
from gpufleet.bench.collectives.plan import plan


def memory_per_rank() -> tuple[int, str]:
    """Bytes one local rank may use for buffers, and of what: free GPU memory, or this
    machine's available memory shared by the local ranks (the caller divides)."""
    import psutil

    try:
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(0)
            return int(free), "free GPU memory"
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return int(psutil.virtual_memory().available), "available memory"


def fit_memory(config: CollectivesConfig, local_ranks: int) -> CollectivesConfig:
    """``config`` with the largest size whose buffers (input, output and the expected result,
    about 4x the size) fit every local rank in 80% of memory; an explicit --max-bytes that
    does not is refused before anything starts."""
    high = config.top()
    free, what = memory_per_rank()
    share = int(free * 0.8) // (1 if what.startswith("free GPU") else local_ranks)
    fits = high
    while fits > 8 and 4 * fits > share:
        fits //= 2
    if fits == high:
        return config
    if config.max_bytes is not None:
        runner.bad(
            "--max-bytes",
            f"{human_bytes(high)} needs about "
            f"{human_bytes(4 * high)} per rank, {local_ranks} ranks here, and only "
            f"{share / 2**20:.0f} MiB per rank of {what} is left: use --max-bytes "
            f"{human_bytes(fits)} or less",
        )
    runner.say(
        f"note: sizes stop at {human_bytes(fits)}: larger ones do not fit "
        f"{what} ({local_ranks} local ranks)"
    )
    return replace(config, max_bytes=fits)


def run(config: CollectivesConfig, spec: Path | None, render: str | None, as_json: bool) -> int:
    """Render the sweep's job for ``render``, or run it here and report; the exit code (1 if
    any result was wrong)."""
    from gpufleet.bench.collectives.report import record

    runner.need_render_spec(
        render, spec, "a TrainingJob that can run on the cluster (image, nodes, resources)"
    )
    job_spec = runner.load_spec(spec)
    cuda = runner.cuda_here() if job_spec is None else False
    (job,) = plan(config, job_spec, rendered=render is not None, cuda=cuda)
    if render is not None:
        runner.print_rendered(job, render)
        return 0
    fitted = fit_memory(config, job.spec.procs_per_node)
    if fitted != config:
        (job,) = plan(fitted, job_spec, cuda=cuda)
    sizes = sweep(fitted.min_bytes, fitted.top())
    runner.say(
        f"collectives: {', '.join(fitted.ops)} from {human_bytes(sizes[0])} to "
        f"{human_bytes(sizes[-1])} on {job.spec.world_size} ranks"
    )
    data = runner.run_job(job, lambda run_dir: run_dir / "collectives.json", "collectives")
    return record(data, config.outdir, as_json)
