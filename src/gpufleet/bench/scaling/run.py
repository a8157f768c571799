"""``gpufleet bench scaling`` end to end: plan, then render the jobs or run them here one by
one, then analyse and report. The edge: it starts workers and writes files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpufleet.bench import runner
from gpufleet.bench.scaling.config import ScalingConfig
from gpufleet.bench.scaling.model import Point
from gpufleet.bench.scaling.plan import plan_points


def run(config: ScalingConfig, spec: Path | None, render: str | None, as_json: bool) -> int:
    """Render every point's job for ``render``, or measure the points here and report."""
    from gpufleet.bench.scaling.report import record

    runner.need_render_spec(render, spec, "a TrainingJob that can run on the cluster")
    points = plan_points(config, runner.load_spec(spec), rendered=render is not None)
    if render is not None:
        for point in points:
            runner.print_rendered(point.job, render)
            sys.stdout.write("---\n")
        return 0
    measured: list[Point] = []
    allreduce: dict[str, Any] | None = None
    for p in points:
        runner.say(f"scaling: {p.mode}, {p.workers} worker(s) on {p.nodes} node(s)")
        data = runner.run_job(
            p.job, lambda run_dir: run_dir / "scaling.json", f"scaling at {p.workers} workers"
        )
        measured.append(Point(**data["point"]))
        allreduce = data.get("allreduce") or allreduce
    return record(measured, allreduce, config.outdir, as_json)
