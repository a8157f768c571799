"""``gpufleet bench collect``: read what a rendered benchmark job's pods published (on the
shared volume or in S3, through fsspec), check it and report as a local run would."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.bench import runner

NAMES = ("coordinated.json", "collectives.json", "training.json")


def collect(results: str, outdir: Path, as_json: bool) -> int:
    """Report the result at ``results`` (training, coordinated, collectives, or scaling's
    points); the exit code: 1 unless it is valid."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(results)
    root = root.rstrip("/")
    try:
        found = [n for n in sorted(NAMES) if fs.isfile(f"{root}/{n}")]
        points = sorted(fs.glob(f"{root}/point-*.json"))
    except Exception as exc:  # an unreachable bucket, a bad URI: one line, not a traceback
        runner.bad("RESULTS", f"{results}: {exc}")
    if not found and not points:
        runner.bad(
            "RESULTS",
            f"{results}: none of {', '.join(sorted(NAMES))} or scaling's "
            "point-*.json (has the job finished?)",
        )
    if not found:
        from gpufleet.bench.scaling.model import Point
        from gpufleet.bench.scaling.report import record

        measured = [json.loads(fs.cat_file(p)) for p in points]
        allreduce = next((m["allreduce"] for m in measured if m.get("allreduce")), None)
        return record([Point(**m["point"]) for m in measured], allreduce, outdir, as_json)
    kind = found[0]
    if kind == "training.json":
        from gpufleet.bench.training.report import record as record_training

        return record_training(results, outdir, as_json)
    data = json.loads(fs.cat_file(f"{root}/{kind}"))
    if kind == "coordinated.json":
        from gpufleet.bench.coordinated.report import show

        return show(data, as_json)
    from gpufleet.bench.collectives.report import show as show_collectives

    return show_collectives(data, as_json)
