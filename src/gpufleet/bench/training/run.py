"""``gpufleet bench training`` end to end: plan, then render the job or run it here, then
collect and score its runs. The edge: it starts workers and writes files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpufleet.bench import runner
from gpufleet.bench.training.config import RESULT_JSON, TrainingConfig
from gpufleet.bench.training.plan import plan, publish_to


def run(config: TrainingConfig, spec: Path | None, render: str | None, as_json: bool) -> int:
    """Render the job for ``render``, or run it here, then collect, check and score its runs
    (exit 1 unless the result is valid)."""
    from gpufleet.bench.training.report import need_mlperf_logging, record

    error = config.errors()
    if error is not None:
        raise error
    runner.need_render_spec(render, spec, "a TrainingJob that can run on the cluster")
    if render is None:
        need_mlperf_logging()
    job_spec = runner.load_spec(spec)
    here = replace(config, outdir=config.outdir.resolve())
    if spec is not None:
        here = replace(here, config_name=spec.name)
    cuda = job_spec is None and runner.cuda_here()
    (job,) = plan(here, job_spec, rendered=render is not None, cuda=cuda)
    if render is not None:
        runner.print_rendered(job, render)
        return 0
    parallelism = job.spec.parallelism
    runner.say(
        f"training: digits to 97% on {job.spec.world_size} worker(s), "
        f"{config.timed_runs()} run(s), {parallelism.strategy}/{parallelism.mixed_precision}"
    )
    runner.run_job(job, lambda run_dir: run_dir / "bench-training" / RESULT_JSON, "training run")
    return record(publish_to(here, job, rendered=False), config.outdir, as_json)
