"""``gpufleet bench coordinated`` end to end: plan, then render the job or run it here, then
report. The edge: it starts workers and reads their merged result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpufleet.bench import runner
from gpufleet.bench.coordinated.config import CoordinatedConfig
from gpufleet.bench.coordinated.plan import plan


def run(config: CoordinatedConfig, spec: Path | None, render: str | None, as_json: bool) -> int:
    """Render the job for ``render``, or run every node here and report (exit 1 unless every
    node is VALID)."""
    from gpufleet.bench.coordinated.report import show

    runner.need_render_spec(render, spec, "a TrainingJob that can run on the cluster")
    here = replace(config, outdir=config.outdir.resolve())
    job_spec = runner.load_spec(spec)
    (job,) = plan(here, job_spec, cuda=job_spec is None and runner.cuda_here())
    if render is not None:
        runner.print_rendered(job, render)
        return 0
    runner.say(f"coordinated: LoadGen {config.scenario} on {config.node_count()} node(s) at once")
    merged = runner.run_job(
        job, lambda _run_dir: config.outdir / "coordinated.json", "coordinated run"
    )
    return show(merged, as_json)
