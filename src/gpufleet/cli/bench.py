"""``gpufleet bench inference``: MLPerf LoadGen against an Open Inference Protocol endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.bench.inference.config import DEFAULTS, InferenceConfig
from gpufleet.cli.bench_jobs import collect, collectives, coordinated, finish, scaling, training
from gpufleet.cli.common import Output

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
    tls_ca: Annotated[
        Path | None,
        typer.Option(help="TLS (gRPC, or HTTP as https): the CA that signed the server's."),
    ] = DEFAULTS.tls_ca,
    tls_cert: Annotated[
        Path | None, typer.Option(help="Mutual TLS: this client's PEM certificate.")
    ] = DEFAULTS.tls_cert,
    tls_key: Annotated[
        Path | None, typer.Option(help="Mutual TLS: this client's PEM key.")
    ] = DEFAULTS.tls_key,
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json.")] = Output.text,
) -> None:
    """Run LoadGen's SingleStream, Server or Offline scenario; exit 0 if VALID, 1 if INVALID."""
    from gpufleet.bench.inference.run import run

    config = InferenceConfig(url=url, model=model, scenario=scenario, target_qps=target_qps,
                             latency_ms=latency_ms, duration=duration, min_queries=min_queries,
                             quick=quick, concurrency=concurrency, outdir=outdir,
                             prometheus=prometheus, tls_ca=tls_ca, tls_cert=tls_cert,
                             tls_key=tls_key)  # fmt: skip
    finish(lambda: run(config, output == Output.json))


bench.command()(collectives)
bench.command()(scaling)
bench.command()(coordinated)
bench.command()(training)
bench.command()(collect)
