"""``gpufleet bench collectives``, ``scaling`` and ``coordinated``: cluster benchmarks run as
gpufleet jobs (gpufleet.bench), here on loopback or rendered for a cluster."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from gpufleet.bench.collectives import OPS  # a light module: torch is imported on use
from gpufleet.cli.common import Output, err_console, fail, print_json
from gpufleet.errors import EXIT_FAILED, FieldError, UserInputError
from gpufleet.spec import TrainingJob

# The options every cluster benchmark shares.
RenderOption = Annotated[
    str | None,
    typer.Option(
        help="Print the cluster objects for this target (job, jobset, pytorchjob, ...) "
        "instead of running here; needs --spec."
    ),
]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="text or json.")]

SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _bad(option: str, message: str) -> NoReturn:
    """Exit 2 with ``option: message``, the CLI's field-error shape."""
    fail(UserInputError([FieldError(option, message)]))


def parse_size(text: str, option: str) -> int:
    """``8``, ``64KiB``, ``1MiB``, ``1GiB`` as bytes; exit 2 naming ``option`` otherwise."""
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


def collectives(
    procs: Annotated[int, typer.Option(help="Worker processes per node.")] = 2,
    nodes: Annotated[int, typer.Option(help="Nodes (elastic agents; on loopback here).")] = 1,
    ops: Annotated[str, typer.Option(help="Comma-separated: " + ", ".join(OPS))] = ",".join(OPS),
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
    render: RenderOption = None,
    outdir: Annotated[
        Path, typer.Option(help="Where collectives.json and collectives.png go.")
    ] = Path("bench-results/collectives"),
    output: OutputOption = Output.text,
) -> None:
    """Collective bandwidth (nccl-tests' algbw and busbw), every result checked; exit 1 if any
    result is wrong."""
    from gpufleet.bench.collectives import MAX_BYTES, human_bytes, sweep

    wanted = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in wanted if o not in OPS]
    if unknown or not wanted:
        _bad("--ops", f"unknown {', '.join(unknown) or 'empty'}; choose from {', '.join(OPS)}")
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
    from gpufleet.bench.jobs import bench_job, shared_results

    shared = shared_results(base, "collectives") if render is not None else None
    if shared:
        args += ["--results", shared]
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


def _run_job(job: TrainingJob, result: Callable[[Path], Path], what: str) -> dict[str, Any]:
    """Run a benchmark job here and read its result file (``result(run_dir)``); exit with the
    job's code, saying why, when it wrote none. Workers' live output goes to stderr: stdout
    holds only the table or the JSON."""
    from gpufleet.launch.local import run_local
    from gpufleet.runtime.files import read_json

    with contextlib.redirect_stdout(sys.stderr):
        summary = run_local(job, fresh=True)
    data = read_json(result(Path(summary.run_dir)))
    if not data:
        err_console.print(f"{what} failed ({summary.status}): {summary.message or ''}")
        raise typer.Exit(summary.exit_code or EXIT_FAILED)
    return dict(data)


def _write_result(
    outdir: Path, name: str, result: dict[str, Any], plot: Callable[[Path], None]
) -> None:
    """``<outdir>/<name>.json`` and, with matplotlib, ``<name>.png``."""
    from gpufleet.runtime.files import write_json_atomic

    outdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(outdir / f"{name}.json", result)
    try:
        plot(outdir / f"{name}.png")
    except ImportError:
        err_console.print("note: no plot: pip install 'gpufleet[bench]' for matplotlib")


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
    from gpufleet.bench.collectives import Row, plot
    from gpufleet.bench.system import describe

    data = _run_job(job, lambda run_dir: run_dir / "collectives.json", "collectives")
    rows = [Row(**r) for r in data["rows"]]
    result = {**data, "system": describe()}
    title = f"busbw, {data['ranks']} ranks, {data['backend']}"
    _write_result(outdir, "collectives", result, lambda png: plot(rows, png, title))
    if output != Output.json:
        err_console.print(f"results: {outdir}/collectives.json, collectives.png")
    _show_collectives(result, output)


def _show_collectives(data: dict[str, Any], output: Output) -> None:
    """The table or the JSON; exit 1 if any result was wrong."""
    from gpufleet.bench.collectives import HEADER, Row, format_row

    rows = [Row(**r) for r in data["rows"]]
    if output == Output.json:
        print_json(data)
    else:
        print(HEADER)
        for row in rows:
            print(format_row(row))
    if not all(r.correct for r in rows):
        wrong = sum(not r.correct for r in rows)
        err_console.print(f"error: {wrong} result(s) were wrong")
        raise typer.Exit(EXIT_FAILED)


def scaling(
    workers: Annotated[
        str, typer.Option(help="World sizes to measure, comma-separated; must include 1.")
    ] = "1,2",
    mode: Annotated[str, typer.Option(help="strong, weak or both.")] = "both",
    batch: Annotated[
        int, typer.Option(help="Strong: the global batch; weak: the batch per worker.")
    ] = 256,
    steps: Annotated[int, typer.Option(help="Timed steps per world size and kind.")] = 20,
    per_node: Annotated[
        int,
        typer.Option(
            help="Workers per node: a larger world size spans nodes (elastic agents, on "
            "loopback here). Default: all on one node; with --spec, its procsPerNode."
        ),
    ] = 0,
    quick: Annotated[bool, typer.Option(help="Smoke run: few steps, a small model.")] = False,
    spec: Annotated[
        Path | None,
        typer.Option(help="A TrainingJob giving image, volumes, resources and procsPerNode."),
    ] = None,
    render: RenderOption = None,
    outdir: Annotated[Path, typer.Option(help="Where scaling.json and scaling.png go.")] = Path(
        "bench-results/scaling"
    ),
    output: OutputOption = Output.text,
) -> None:
    """Strong and weak scaling of DDP training (synthetic MLP): efficiency, the step split into
    compute, communication and data, and predicted efficiency at 4-64 workers on this link,
    NVLink, InfiniBand HDR and 25 GbE (alpha-beta model, checked at every measured point)."""
    sizes = _world_sizes(workers)
    modes = {"both": ["strong", "weak"], "strong": ["strong"], "weak": ["weak"]}.get(mode)
    if modes is None:
        _bad("--mode", f"must be strong, weak or both, got {mode!r}")
    if batch < 1 or steps < 1 or per_node < 0:
        _bad("--batch" if batch < 1 else "--steps" if steps < 1 else "--per-node",
             "must be at least 1" if per_node >= 0 else "must be 0 or more")  # fmt: skip
    for n in sizes:
        if modes and "strong" in modes and batch % n:
            _bad(
                "--batch",
                f"strong scaling splits the global batch {batch} over {n} "
                f"workers: use a batch divisible by {max(sizes)}",
            )
    if render is not None and spec is None:
        _bad("--render", "needs --spec: a TrainingJob that can run on the cluster")
    from gpufleet.bench.jobs import bench_job, local_job, shared_results

    base = _bench_base(spec, 1, 1) if spec is not None else None
    per_node = per_node or (base.spec.procs_per_node if base else max(sizes))
    for n in sizes:
        if n > per_node and n % per_node:
            _bad("--workers", f"{n} workers do not fill whole nodes of {per_node} (--per-node)")
    model = ["--input-size", "64", "--hidden-size", "256", "--layers", "2"] if quick else []
    args = ["--batch", str(batch), "--steps", str(3 if quick else steps), "--warmup",
            "1" if quick else "4", *model]  # fmt: skip
    shared = shared_results(base, "scaling") if base is not None and render else None
    if shared:
        args += ["--results", shared]
    jobs = []
    for m in modes or []:
        for n in sizes:
            nodes, procs = (1, n) if n <= per_node else (n // per_node, per_node)
            fit = ["--fit"] if n == max(sizes) else []
            if base is None:
                point_base = local_job("scaling", nodes=nodes, procs_per_node=procs, gpus=0)
            else:
                gpus = base.spec.resources.gpu and procs
                update = {
                    "nodes": nodes,
                    "procs_per_node": procs,
                    "min_nodes": None,
                    "resources": base.spec.resources.model_copy(update={"gpu": gpus}),
                }
                point_base = base.model_copy(
                    update={"spec": base.spec.model_copy(update=update)}
                )  # fmt: skip
            prefix = f"{base.metadata.name}-" if base is not None else ""
            job = bench_job(point_base, f"{prefix}scaling-{m}-{n}", "gpufleet.bench.scaling",
                            [*args, "--mode", m, *fit])  # fmt: skip
            jobs.append((m, n, nodes, job))
    if render is not None:
        for _m, _n, _nodes, job in jobs:
            _print_rendered(job, render)
            sys.stdout.write("---\n")
        return
    from gpufleet.bench.scaling import Point

    points: list[Point] = []
    allreduce = None
    for m, n, nodes, job in jobs:
        err_console.print(f"scaling: {m}, {n} worker(s) on {nodes} node(s)")
        data = _run_job(job, lambda run_dir: run_dir / "scaling.json", f"scaling at {n} workers")
        points.append(Point(**data["point"]))
        allreduce = data.get("allreduce") or allreduce
    _show_scaling(points, allreduce, outdir, output)


def _show_scaling(
    points: list[Any], allreduce: dict[str, Any] | None, outdir: Path, output: Output
) -> None:
    """Analyse the points (efficiency, the predictor and its check), write scaling.json and
    the plot, print the table or the JSON."""
    from dataclasses import asdict

    from gpufleet.bench.scaling import analyze, plot, table
    from gpufleet.bench.system import describe

    analysis = analyze(points, allreduce)
    result = {
        "points": [asdict(p) for p in points],
        "analysis": analysis,
        "allreduce": allreduce,
        "system": describe(),
    }
    _write_result(outdir, "scaling", result, lambda png: plot(points, analysis, png))
    if output == Output.json:
        print_json(result)
    else:
        print("\n".join(table(points, analysis)))
        err_console.print(f"results: {outdir}/scaling.json, scaling.png")


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        _bad("--workers", f"must be comma-separated numbers like 1,2,4, got {text!r}")
    if not sizes or sizes[0] != 1 or sizes[-1] > 1024:
        _bad(
            "--workers",
            f"must include 1 (efficiency is relative to one worker) and stay "
            f"within 1..1024, got {text!r}",
        )
    return sizes


def coordinated(
    urls: Annotated[
        str,
        typer.Option(
            help="Each node's Open Inference Protocol endpoint, comma-separated "
            "(host:port for gRPC, http://host:port); node i uses entry i."
        ),
    ],
    model: Annotated[str, typer.Option(help="The model every node queries.")],
    scenario: Annotated[str, typer.Option(help="SingleStream, Server or Offline.")] = "Offline",
    target_qps: Annotated[
        float | None, typer.Option(help="Per node. Server: the scheduled rate (required).")
    ] = None,
    latency_ms: Annotated[float, typer.Option(help="Server: the p99 bound in ms.")] = 100.0,
    duration: Annotated[float, typer.Option(help="Minimum run time per node, seconds.")] = 60.0,
    nodes: Annotated[
        int | None, typer.Option(help="Nodes (default: one per URL); on loopback here.")
    ] = None,
    quick: Annotated[bool, typer.Option(help="At most 2 s per node (smoke).")] = False,
    spec: Annotated[
        Path | None, typer.Option(help="A TrainingJob giving image, volumes and queue.")
    ] = None,
    render: RenderOption = None,
    outdir: Annotated[
        Path, typer.Option(help="Where coordinated.json and each node's logs go.")
    ] = Path("bench-results/coordinated"),
    output: OutputOption = Output.text,
) -> None:
    """MLPerf LoadGen on every node at once (started together at the rendezvous), merged per
    scenario with per-node rows; exit 1 unless every node is VALID."""
    from gpufleet.serve.loadgen.settings import BenchConfig

    endpoints = [u.strip() for u in urls.split(",") if u.strip()]
    if not endpoints:
        _bad("--urls", "give at least one endpoint")
    count = nodes or len(endpoints)
    errors = BenchConfig(
        url=endpoints[0],
        model=model,
        scenario=scenario,
        target_qps=target_qps,
        latency_ms=latency_ms,
        duration=duration,
    ).errors()
    if errors:
        fail(UserInputError(errors))
    if render is not None and spec is None:
        _bad("--render", "needs --spec: a TrainingJob that can run on the cluster")
    base = _bench_base(spec, count, 1)
    if spec is not None and base.spec.checkpoint.dir and "://" not in base.spec.checkpoint.dir:
        results = f"{base.spec.checkpoint.dir.rstrip('/')}/coordinated"  # the shared volume
    else:
        results = str(outdir.resolve())
    args = [
        "--urls",
        ",".join(endpoints),
        "--model",
        model,
        "--scenario",
        scenario,
        "--latency-ms",
        str(latency_ms),
        "--duration",
        str(duration),
        "--outdir",
        results,
    ]
    if target_qps is not None:
        args += ["--target-qps", str(target_qps)]
    if quick:
        args.append("--quick")
    from gpufleet.bench.jobs import bench_job

    name = f"{base.metadata.name}-coordinated" if spec else "coordinated"
    job = bench_job(base, name, "gpufleet.bench.coordinated", args)
    if render is not None:
        _print_rendered(job, render)
        return
    err_console.print(f"coordinated: LoadGen {scenario} on {count} node(s) at once")
    merged = _run_job(job, lambda _run_dir: outdir / "coordinated.json", "coordinated run")
    _show_coordinated(merged, output)


def _show_coordinated(merged: dict[str, Any], output: Output) -> None:
    """The table or the JSON; exit 1 unless every node was VALID."""
    if output == Output.json:
        print_json(merged)
    else:
        print("\n".join(coordinated_table(merged)))
    if not merged["aggregate"]["valid"]:
        raise typer.Exit(EXIT_FAILED)


def coordinated_table(merged: dict[str, object]) -> list[str]:
    """Per-node rows and the aggregate, as text lines."""
    agg: dict[str, Any] = merged["aggregate"]  # type: ignore[assignment]
    nodes: list[dict[str, Any]] = merged["nodes"]  # type: ignore[assignment]
    key = agg["rate_key"]
    unit = "samples/s" if key == "samples_per_second" else "QPS"
    lines = [
        f"{'node':<6}{'url':<28}{'result':<9}{unit if key else '':>10}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'queries':>9}{'errors':>8}"
    ]
    for n in nodes:
        rate = f"{n.get(key) or 0:.1f}" if key else ""
        lat = n["latency_ms"]
        lines.append(
            f"{n['node']:<6}{n['url'][:27]:<28}{n['result']:<9}{rate:>10}"
            f"{lat.get('p50', float('nan')):>9.2f}{lat.get('p99', float('nan')):>9.2f}"
            f"{n['queries']:>9}{n['errors']:>8}"
        )
    total = f"{agg['aggregate_rate']:.1f}" if key else ""
    verdict = "VALID" if agg["valid"] else "INVALID"
    worst = agg["worst_latency_ms"]
    lines.append(
        f"{'all':<6}{'':<28}{verdict:<9}{total:>10}{worst['p50']:>9.2f}"
        f"{worst['p99']:>9.2f}{agg['queries']:>9}{agg['errors']:>8}"
    )
    lines.append(f"start skew across nodes: {agg['start_skew_seconds'] * 1e3:.1f} ms")
    return lines


def training(
    runs: Annotated[
        int, typer.Option(help="Timed runs (seeds seed, seed+1, ...); MLPerf scores 5 or more.")
    ] = 5,
    procs: Annotated[int, typer.Option(help="Worker processes per node.")] = 2,
    nodes: Annotated[int, typer.Option(help="Nodes (elastic agents; on loopback here).")] = 1,
    batch_size: Annotated[int, typer.Option(help="Samples per worker and step.")] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate (SGD, cosine decay).")] = 0.05,
    max_epochs: Annotated[
        int, typer.Option(help="A run that has not reached the target by then is aborted.")
    ] = 40,
    seed: Annotated[int, typer.Option(help="The first run's seed.")] = 0,
    strategy: Annotated[
        str | None, typer.Option(help="ddp or fsdp (default: the spec's, else ddp).")
    ] = None,
    precision: Annotated[
        str | None, typer.Option(help="fp32 or bf16 (default: the spec's, else fp32).")
    ] = None,
    quick: Annotated[bool, typer.Option(help="Smoke run: one run (seconds).")] = False,
    spec: Annotated[
        Path | None,
        typer.Option(help="A TrainingJob giving nodes, resources, image, volumes, parallelism."),
    ] = None,
    render: RenderOption = None,
    results: Annotated[
        str | None,
        typer.Option(
            help="Where the job publishes its MLLOG files (a directory or s3:// URI). Default: "
            "--outdir here; rendered, <spec.checkpoint.dir>/bench-training."
        ),
    ] = None,
    outdir: Annotated[
        Path, typer.Option(help="Where training.json, training.png and the logs go.")
    ] = Path("bench-results/training"),
    output: OutputOption = Output.text,
) -> None:
    """MLPerf Training-style time to target: the digits CNN to 97% test accuracy on every node
    at once, MLLOG lines from mlperf-logging, each run checked by its compliance checker and
    the set scored as MLPerf does; exit 1 unless the result is valid."""
    for option, value in (("--runs", runs), ("--batch-size", batch_size), ("--max-epochs",
                          max_epochs)):  # fmt: skip
        if value < 1:
            _bad(option, "must be at least 1")
    if lr <= 0:
        _bad("--lr", "must be positive")
    if strategy not in (None, "ddp", "fsdp"):
        _bad("--strategy", f"must be ddp or fsdp, got {strategy!r}")
    if precision not in (None, "fp32", "bf16"):
        _bad("--precision", f"must be fp32 or bf16, got {precision!r}")
    if render is not None and spec is None:
        _bad("--render", "needs --spec: a TrainingJob that can run on the cluster")
    if render is None:
        _need_mlperf_logging()
    base = _bench_base(spec, nodes, procs)
    chosen = {"strategy": strategy, "mixed_precision": precision}
    parallelism = base.spec.parallelism.model_copy(
        update={k: v for k, v in chosen.items() if v is not None}
    )
    micro = parallelism.gradient_accumulation
    if batch_size % micro:
        _bad("--batch-size", f"{batch_size} does not split into {micro} micro-batches "
             "(the spec's parallelism.gradientAccumulation)")  # fmt: skip
    base = base.model_copy(
        update={"spec": base.spec.model_copy(update={"parallelism": parallelism})}
    )
    from gpufleet.bench.jobs import bench_job, shared_results

    if results is None and render is not None:
        results = shared_results(base, "training")  # the shared volume or S3
        if results is None:
            _bad("--results", "the rendered job needs somewhere shared to write: set "
                 "spec.checkpoint.dir or --results")  # fmt: skip
    results = results or str((outdir / "published").resolve())
    args = ["--runs", str(1 if quick else runs), "--batch-size", str(batch_size), "--lr",
            str(lr), "--max-epochs", str(max_epochs), "--seed", str(seed), "--results",
            results]  # fmt: skip
    if spec is not None:
        args += ["--config-name", spec.name]
    name = f"{base.metadata.name}-training" if spec else "training"
    job = bench_job(base, name, "gpufleet.bench.training", args, parallelism=True)
    if render is not None:
        _print_rendered(job, render)
        return
    err_console.print(
        f"training: digits to 97% on {base.spec.world_size} worker(s), "
        f"{1 if quick else runs} run(s), {parallelism.strategy}/{parallelism.mixed_precision}"
    )
    _run_job(job, lambda run_dir: run_dir / "bench-training" / "training.json", "training run")
    _collect_training(results, outdir, output)


def _need_mlperf_logging() -> None:
    """Exit 1 with the install line when the optional mlperf-logging package is missing."""
    import importlib.util

    if importlib.util.find_spec("mlperf_logging") is None:
        err_console.print(
            "error: bench training needs mlperf-logging: pip install 'gpufleet[bench]'"
        )
        raise typer.Exit(EXIT_FAILED)


def _collect_training(results: str, outdir: Path, output: Output) -> None:
    _need_mlperf_logging()
    from gpufleet.bench.system import describe
    from gpufleet.bench.training import collect, plot, table

    try:
        summary = collect(results, outdir)
    except FileNotFoundError as exc:
        _bad("RESULTS", str(exc))
    summary["collector"] = describe()
    _write_result(outdir, "training", summary, lambda png: plot(summary, png))
    if output == Output.json:
        print_json(summary)
    else:
        print("\n".join(table(summary)))
        err_console.print(f"results: {outdir}/training.json, training.png, logs in {outdir}/logs")
    if not summary["aggregate"]["valid"]:
        raise typer.Exit(EXIT_FAILED)


def collect(
    results: Annotated[
        str,
        typer.Argument(
            help="Where a rendered benchmark job wrote its results: a directory on the shared "
            "volume, or an s3:// URI."
        ),
    ],
    outdir: Annotated[Path, typer.Option(help="Where the collected result and logs go.")] = Path(
        "bench-results/collected"
    ),
    output: OutputOption = Output.text,
) -> None:
    """The collector step of a cluster benchmark: read what the job's pods wrote (bench
    training, coordinated, collectives or scaling's points), check it and print the aggregate;
    exit 1 unless it is valid."""
    import json

    import fsspec

    fs, root = fsspec.core.url_to_fs(results)
    root = root.rstrip("/")
    names = {"training.json", "coordinated.json", "collectives.json"}
    try:
        found = [n for n in sorted(names) if fs.isfile(f"{root}/{n}")]
        points = sorted(fs.glob(f"{root}/point-*.json"))
    except Exception as exc:  # an unreachable bucket, a bad URI: one line, not a traceback
        _bad("RESULTS", f"{results}: {exc}")
    if not found and not points:
        _bad("RESULTS", f"{results}: none of {', '.join(sorted(names))} or scaling's "
             "point-*.json (has the job finished?)")  # fmt: skip
    if not found:
        from gpufleet.bench.scaling import Point

        measured = [json.loads(fs.cat_file(p)) for p in points]
        allreduce = next((m["allreduce"] for m in measured if m.get("allreduce")), None)
        _show_scaling([Point(**m["point"]) for m in measured], allreduce, outdir, output)
        return
    kind = found[0]
    if kind == "training.json":
        _collect_training(results, outdir, output)
        return
    data = json.loads(fs.cat_file(f"{root}/{kind}"))
    if kind == "coordinated.json":
        _show_coordinated(data, output)
    else:
        _show_collectives(data, output)
