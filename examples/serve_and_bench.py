"""The second half of `make demo`: the digits model just trained, exported, served and measured.

1. `gpufleet export` the newest checkpoint of .gpufleet/runs/digits into a Triton repository;
2. serve it with real Triton (PyTriton) on 127.0.0.1;
3. MLPerf LoadGen, Offline then Server (a short run each), through tritonclient over gRPC;
4. print what each reported. LoadGen's logs and plots stay in .gpufleet/demo/loadgen-*.

The same steps by hand:
    gpufleet export .gpufleet/runs/digits --repository models
    gpufleet serve --repository models &
    gpufleet bench inference --url 127.0.0.1:8001 --model digits --scenario Offline --quick
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpufleet.net import free_port
from gpufleet.serve.export import export
from gpufleet.serve.loadgen import BenchConfig, BenchResult, run_bench
from gpufleet.serve.server import ServeConfig, serving

RUN = Path(".gpufleet/runs/digits")
DEMO = Path(".gpufleet/demo")


def main() -> int:
    console = Console()
    shutil.rmtree(DEMO, ignore_errors=True)
    entry, what = export(str(RUN), DEMO / "repository", model="digits")
    console.print(f"exported {what} -> {entry.directory}")
    config = ServeConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=DEMO / "triton.log",
    )
    results: list[BenchResult] = []
    with serving(DEMO / "repository", config) as endpoints:
        console.print(f"serving with Triton: HTTP {endpoints.http}, gRPC {endpoints.grpc}")
        offline = run_bench(
            BenchConfig(
                url=endpoints.grpc,
                model="digits",
                scenario="Offline",
                quick=True,
                outdir=DEMO / "loadgen-offline",
            )
        )
        results.append(offline)
        # Server: a third of the Offline throughput, 99th percentile under 100 ms.
        qps = max(10.0, round(0.3 * (offline.samples_per_second or 30)))
        results.append(
            run_bench(
                BenchConfig(
                    url=endpoints.grpc,
                    model="digits",
                    scenario="Server",
                    target_qps=qps,
                    latency_ms=100,
                    quick=True,
                    outdir=DEMO / "loadgen-server",
                )
            )
        )
    table = Table(title="MLPerf LoadGen against gpufleet serve (digits, Triton, gRPC)")
    for column in ("scenario", "result", "samples/s", "p50 ms", "p99 ms", "queries"):
        table.add_column(column, justify="right" if column != "scenario" else "left")
    for r in results:
        rate = r.samples_per_second or r.scheduled_qps or 0.0
        table.add_row(
            r.scenario,
            r.result,
            f"{rate:.0f}",
            f"{r.latency_ms.get('p50', 0):.1f}",
            f"{r.latency_ms.get('p99', 0):.1f}",
            str(r.queries),
        )
    console.print(table)
    console.print(f"LoadGen logs and latency plots: {DEMO}/loadgen-*/")
    if not all(r.valid for r in results):  # a measurement, not a failure of the demo
        console.print("INVALID: the machine was too busy for the latency bound; see the logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
