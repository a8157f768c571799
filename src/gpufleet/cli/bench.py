"""``gpufleet bench inference``: MLPerf LoadGen against an Open Inference Protocol endpoint."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import Output, err_console, fail
from gpufleet.errors import EXIT_FAILED, FieldError, UserInputError
from gpufleet.serve.loadgen.settings import BenchConfig
from gpufleet.spec import TrainingJob

# The options' defaults are BenchConfig's: one home for each (a light module, no LoadGen import).
DEFAULTS = BenchConfig(url="", model="")

bench = typer.Typer(
    help="Benchmarks: inference with MLPerf LoadGen, collective bandwidth.", no_args_is_help=True
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


# gpufleet.bench.collectives.OPS's names (that module imports torch lazily, but this one
# stays light for the CLI's start).
_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _bad(option: str, message: str) -> NoReturn:
    """Exit 2 with ``option: message``, the CLI's field-error shape."""
    fail(UserInputError([FieldError(option, message)]))


def parse_size(text: str, option: str) -> int:
    """``8``, ``64KiB``, ``1MiB``, ``1GiB`` as bytes; exit 2 naming ``option`` otherwise."""
    import re

    match = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", text)
    if not match or int(match.group(1)) < 1:
        _bad(option, f"must be a size like 8, 64KiB, 1MiB or 1GiB, got {text!r}")
    return int(match.group(1)) * SIZE_UNITS[match.group(2) or ""]


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


@bench.command()
def collectives(
    procs: Annotated[int, typer.Option(help="Worker processes per node.")] = 2,
    nodes: Annotated[int, typer.Option(help="Nodes (elastic agents; on loopback here).")] = 1,
    ops: Annotated[str, typer.Option(help="Comma-separated: " + ", ".join(_OPS))] = ",".join(_OPS),
    min_bytes: Annotated[str, typer.Option(help="Smallest size (8, 4KiB, 1MiB).")] = "8",
    max_bytes: Annotated[
        str | None,
        typer.Option(help="Largest size (default 1GiB, lowered to what memory holds)."),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="Smoke run: 8 B to 1 MiB, few iterations (seconds).")
    ] = False,
    spec: Annotated[
        Path | None,
        typer.Option(
            help="A TrainingJob whose nodes, resources, image and volumes to use "
            "(its command is replaced by the benchmark)."
        ),
    ] = None,
    render: Annotated[
        str | None,
        typer.Option(
            help="Print the cluster objects for this target (job, jobset, "
            "pytorchjob, ...) instead of running here; needs --spec."
        ),
    ] = None,
    outdir: Annotated[
        Path, typer.Option(help="Where collectives.json and collectives.png go.")
    ] = Path("bench-results/collectives"),
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json.")] = Output.text,
) -> None:
    """Collective bandwidth (nccl-tests' algbw and busbw), every result checked; exit 1 if any
    result is wrong."""
    from gpufleet.bench.collectives import MAX_BYTES, human_bytes, sweep

    wanted = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in wanted if o not in _OPS]
    if unknown or not wanted:
        _bad("--ops", f"unknown {', '.join(unknown) or 'empty'}; choose from {', '.join(_OPS)}")
    low = parse_size(min_bytes, "--min-bytes")
    high = parse_size(max_bytes, "--max-bytes") if max_bytes else (1 << 20 if quick else MAX_BYTES)
    if low > high:
        _bad("--min-bytes", f"{human_bytes(low)} is above --max-bytes {human_bytes(high)}")
    if render is not None and spec is None:
        _bad(
            "--render",
            "needs --spec: a TrainingJob that can run on the cluster (image, nodes, resources)",
        )
    base = _bench_base(spec, nodes, procs)
    if render is None:
        high = _fit_memory(high, base.spec.procs_per_node, explicit=max_bytes is not None)
    args = ["--ops", ",".join(wanted), "--min-bytes", str(low), "--max-bytes", str(high)]
    if quick:
        args += ["--min-seconds", "0.02", "--max-iters", "5"]
    from gpufleet.bench.jobs import bench_job

    job = bench_job(
        base,
        f"{base.metadata.name}-collectives" if spec else "collectives",
        "gpufleet.bench.collectives",
        args,
    )
    if render is not None:
        _print_rendered(job, render)
        return
    sizes = sweep(low, high)
    err_console.print(
        f"collectives: {', '.join(wanted)} from {human_bytes(sizes[0])} to "
        f"{human_bytes(sizes[-1])} on {base.spec.world_size} ranks"
    )
    _run_collectives(job, outdir, output)


def _bench_base(spec: Path | None, nodes: int, procs: int) -> TrainingJob:
    from gpufleet.bench.jobs import local_job
    from gpufleet.cli.common import load_job

    if spec is not None:
        return load_job(str(spec), None)
    try:
        import torch

        gpus = procs if torch.cuda.is_available() else 0
    except ImportError:  # pragma: no cover
        gpus = 0
    try:
        return local_job("collectives", nodes=nodes, procs_per_node=procs, gpus=gpus)
    except UserInputError as exc:  # --procs 0 and the like, with the spec's words
        fail(UserInputError([FieldError(_flag(e.path), e.message) for e in exc.errors]))


def _flag(path: str) -> str:
    return {"spec.procsPerNode": "--procs", "spec.nodes": "--nodes"}.get(path, path)


def _fit_memory(high: int, local_ranks: int, *, explicit: bool) -> int:
    """The largest size whose buffers (input, output and the expected result, about 4x the
    size) fit every local rank in 80% of memory; an explicit --max-bytes that does not is
    refused before anything starts."""
    from gpufleet.bench.collectives import human_bytes

    free, what = memory_per_rank()
    share = int(free * 0.8) // (1 if what.startswith("free GPU") else local_ranks)
    fits = high
    while fits > 8 and 4 * fits > share:
        fits //= 2
    if fits == high:
        return high
    if explicit:
        _bad(
            "--max-bytes",
            f"{human_bytes(high)} needs about "
            f"{human_bytes(4 * high)} per rank, {local_ranks} ranks here, and only "
            f"{share / 2**20:.0f} MiB per rank of {what} is left: use --max-bytes "
            f"{human_bytes(fits)} or less",
        )
    err_console.print(
        f"note: sizes stop at {human_bytes(fits)}: larger ones do not fit "
        f"{what} ({local_ranks} local ranks)"
    )
    return fits


def _print_rendered(job: TrainingJob, target: str) -> None:
    import yaml

    from gpufleet.render import TARGETS, render

    if target not in TARGETS:
        _bad("--render", f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}")
    try:
        objects = render(job, target)
    except UserInputError as exc:
        fail(exc)
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))


def _run_collectives(job: TrainingJob, outdir: Path, output: Output) -> None:
    from gpufleet.bench.collectives import Row, format_row, plot
    from gpufleet.cli.common import print_json
    from gpufleet.launch.local import run_local
    from gpufleet.runtime.files import read_json, write_json_atomic

    # Workers' live output goes to stderr; stdout holds only the table or the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        summary = run_local(job, fresh=True)
    data = read_json(Path(summary.run_dir) / "collectives.json")
    if not data:
        err_console.print(f"collectives failed ({summary.status}): {summary.message or ''}")
        raise typer.Exit(summary.exit_code or EXIT_FAILED)
    rows = [Row(**r) for r in data["rows"]]
    outdir.mkdir(parents=True, exist_ok=True)
    from gpufleet.bench.system import describe

    result = {**data, "system": describe()}
    write_json_atomic(outdir / "collectives.json", result)
    try:
        plot(rows, outdir / "collectives.png", f"busbw, {data['ranks']} ranks, {data['backend']}")
    except ImportError:
        err_console.print("note: no plot: pip install 'gpufleet[bench]' for matplotlib")
    if output == Output.json:
        print_json(result)
    else:
        from gpufleet.bench.collectives import HEADER

        print(HEADER)
        for row in rows:
            print(format_row(row))
        err_console.print(f"results: {outdir}/collectives.json, collectives.png")
    if not all(r.correct for r in rows):
        wrong = sum(not r.correct for r in rows)
        err_console.print(f"error: {wrong} result(s) were wrong")
        raise typer.Exit(EXIT_FAILED)
