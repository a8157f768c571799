"""``gpufleet bench inference``: MLPerf LoadGen against an Open Inference Protocol endpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.bench_cluster import collect, collectives, coordinated, scaling, training
from gpufleet.cli.common import Output, err_console, fail
from gpufleet.errors import EXIT_FAILED, UserInputError
from gpufleet.serve.loadgen.settings import BenchConfig

# The options' defaults are BenchConfig's: one home for each (a light module, no LoadGen import).
DEFAULTS = BenchConfig(url="", model="")

bench = typer.Typer(
    help="Benchmarks: LoadGen inference (one node or all at once), collectives, scaling, "
    "time to target (MLPerf Training logs), and the collector of cluster runs.",
    no_args_is_help=True,
)


@bench.command()
def inference(
    url: Annotated[
        str,
        typer.Option(
            help="host:port (gRPC) or http://host:port of an Open Inference Protocol "
            "v2 server, e.g. Triton."
        ),
    ],
    model: Annotated[str, typer.Option(help="The model to query.")],
    scenario: Annotated[
        str, typer.Option(help="SingleStream, Server or Offline.")
    ] = DEFAULTS.scenario,
    target_qps: Annotated[
        float | None,
        typer.Option(help="Server: the scheduled queries/s; Offline: the expected samples/s."),
    ] = DEFAULTS.target_qps,
    latency_ms: Annotated[
        float, typer.Option(help="Server: the 99th-percentile latency bound in ms.")
    ] = DEFAULTS.latency_ms,
    duration: Annotated[
        float, typer.Option(help="Minimum run time in seconds (MLPerf rules: 600).")
    ] = DEFAULTS.duration,
    min_queries: Annotated[
        int, typer.Option(help="Minimum queries LoadGen issues.")
    ] = DEFAULTS.min_queries,
    quick: Annotated[
        bool, typer.Option(help="At most 2 s and 64 queries (tests, smoke).")
    ] = DEFAULTS.quick,
    concurrency: Annotated[
        int, typer.Option(help="Most requests in flight.")
    ] = DEFAULTS.concurrency,
    outdir: Annotated[
        Path, typer.Option(help="Where LoadGen's logs, result.json and latency.png go.")
    ] = DEFAULTS.outdir,
    prometheus: Annotated[
        bool, typer.Option(help="Also write result.prom (Prometheus text format).")
    ] = DEFAULTS.prometheus,
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json.")] = Output.text,
) -> None:
    """Run LoadGen's SingleStream, Server or Offline scenario; exit 0 if VALID, 1 if INVALID."""
    from gpufleet.serve.loadgen import run_bench

    cfg = BenchConfig(
        url=url,
        model=model,
        scenario=scenario,
        target_qps=target_qps,
        latency_ms=latency_ms,
        duration=duration,
        min_queries=min_queries,
        quick=quick,
        concurrency=concurrency,
        outdir=outdir,
        prometheus=prometheus,
    )
    try:
        result = run_bench(cfg)
    except UserInputError as exc:
        fail(exc)
    if output == Output.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        table = Table(title=f"LoadGen {scenario}: {model} at {url}", show_header=False)
        rate = result.samples_per_second or result.scheduled_qps
        rows = [
            ("result", result.result),
            ("samples/s" if scenario == "Offline" else "queries/s", f"{rate:.1f}" if rate else "-"),
            (
                "latency p50 / p90 / p99 ms",
                " / ".join(
                    f"{result.latency_ms.get(k, float('nan')):.2f}" for k in ("p50", "p90", "p99")
                ),
            ),
            ("queries (errors)", f"{result.queries} ({result.errors})"),
            ("logs", str(outdir)),
        ]
        for k, v in rows:
            table.add_row(k, v)
        Console(file=sys.stdout, markup=False).print(table)
        if result.first_error:
            err_console.print(f"first error: {result.first_error}")
    if not result.valid:
        raise typer.Exit(EXIT_FAILED)


bench.command()(collectives)
bench.command()(scaling)
bench.command()(coordinated)
bench.command()(training)
bench.command()(collect)
