"""What ``gpufleet bench inference`` shows: one LoadGen run as a table or JSON."""

from __future__ import annotations

import json
import sys

from gpufleet.serve.loadgen.settings import BenchConfig, BenchResult


def rows(config: BenchConfig, result: BenchResult) -> list[tuple[str, str]]:
    """The table's (name, value) rows."""
    rate = result.samples_per_second or result.scheduled_qps
    latency = " / ".join(
        f"{result.latency_ms.get(k, float('nan')):.2f}" for k in ("p50", "p90", "p99")
    )
    return [
        ("result", result.result),
        (
            "samples/s" if config.scenario == "Offline" else "queries/s",
            f"{rate:.1f}" if rate else "-",
        ),
        ("latency p50 / p90 / p99 ms", latency),
        ("queries (errors)", f"{result.queries} ({result.errors})"),
        ("logs", str(config.outdir)),
    ]


def show(config: BenchConfig, result: BenchResult, as_json: bool) -> None:
    """The JSON, or the table and the first error (stderr)."""
    from rich.console import Console
    from rich.table import Table

    from gpufleet.bench import runner

    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    table = Table(
        title=f"LoadGen {config.scenario}: {config.model} at {config.url}", show_header=False
    )
    for k, v in rows(config, result):
        table.add_row(k, v)
    Console(file=sys.stdout, markup=False).print(table)
    if result.first_error:
        runner.say(f"first error: {result.first_error}")
