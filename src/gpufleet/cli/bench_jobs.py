"""``gpufleet bench collectives``, ``scaling``, ``coordinated``, ``training`` and ``collect``:
the options of the cluster benchmarks (gpufleet.bench.<name>, run as gpufleet jobs, here on
loopback or rendered for a cluster), each read from the benchmark's config, and one call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.bench.collectives.config import CollectivesConfig
from gpufleet.bench.collectives.ops import OPS  # light modules: torch is imported on use
from gpufleet.bench.coordinated.config import CoordinatedConfig
from gpufleet.bench.scaling.config import ScalingConfig
from gpufleet.bench.training.config import PRECISION_HELP, STRATEGY_HELP, TrainingConfig
from gpufleet.cli.common import Output, fail
from gpufleet.errors import UserInputError

COLLECTIVES = CollectivesConfig()
SCALING = ScalingConfig()
COORDINATED = CoordinatedConfig(urls=(), model="")
TRAINING = TrainingConfig()

# The options every cluster benchmark shares.
RenderOption = Annotated[
    str | None,
    typer.Option(
        help="Print the cluster objects for this target (job, jobset, pytorchjob, ...) "
        "instead of running here; needs --spec."
    ),
]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="text or json.")]


def finish(command: Callable[[], int]) -> None:
    """Run a benchmark command: its user errors exit 2 with their option, its code is ours."""
    try:
        code = command()
    except UserInputError as exc:
        fail(exc)
    if code:
        raise typer.Exit(code)


def collectives(
    procs: Annotated[int, typer.Option(help="Worker processes per node.")] = COLLECTIVES.procs,
    nodes: Annotated[
        int, typer.Option(help="Nodes (elastic agents; on loopback here).")
    ] = COLLECTIVES.nodes,
    ops: Annotated[str, typer.Option(help="Comma-separated: " + ", ".join(OPS))] = ",".join(
        COLLECTIVES.ops
    ),
    min_bytes: Annotated[str, typer.Option(help="Smallest size (8, 4KiB, 1MiB).")] = str(
        COLLECTIVES.min_bytes
    ),
    max_bytes: Annotated[
        str | None,
        typer.Option(help="Largest size (default 1GiB, lowered to what memory holds)."),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="Smoke run: 8 B to 1 MiB, few iterations (seconds).")
    ] = COLLECTIVES.quick,
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
    ] = COLLECTIVES.outdir,
    output: OutputOption = Output.text,
) -> None:
    """Collective bandwidth (nccl-tests' algbw and busbw), every result checked; exit 1 if any
    result is wrong."""
    from gpufleet.bench.collectives.run import run

    config = CollectivesConfig.parse(procs=procs, nodes=nodes, ops=ops, min_bytes=min_bytes,
                                     max_bytes=max_bytes, quick=quick, outdir=outdir)  # fmt: skip
    finish(lambda: run(config, spec, render, output == Output.json))


def scaling(
    workers: Annotated[
        str, typer.Option(help="World sizes to measure, comma-separated; must include 1.")
    ] = ",".join(map(str, SCALING.workers)),
    mode: Annotated[str, typer.Option(help="strong, weak or both.")] = SCALING.mode,
    batch: Annotated[
        int, typer.Option(help="Strong: the global batch; weak: the batch per worker.")
    ] = SCALING.batch,
    steps: Annotated[
        int, typer.Option(help="Timed steps per world size and kind.")
    ] = SCALING.steps,
    per_node: Annotated[
        int,
        typer.Option(
            help="Workers per node: a larger world size spans nodes (elastic agents, on "
            "loopback here). Default: all on one node; with --spec, its procsPerNode."
        ),
    ] = SCALING.per_node,
    quick: Annotated[
        bool, typer.Option(help="Smoke run: few steps, a small model.")
    ] = SCALING.quick,
    spec: Annotated[
        Path | None,
        typer.Option(help="A TrainingJob giving image, volumes, resources and procsPerNode."),
    ] = None,
    render: RenderOption = None,
    outdir: Annotated[
        Path, typer.Option(help="Where scaling.json and scaling.png go.")
    ] = SCALING.outdir,
    output: OutputOption = Output.text,
) -> None:
    """Strong and weak scaling of DDP training (synthetic MLP): efficiency, the step split into
    compute, communication and data, and predicted efficiency at 4-64 workers on this link,
    NVLink, InfiniBand HDR and 25 GbE (alpha-beta model, checked at every measured point)."""
    from gpufleet.bench.scaling.run import run

    config = ScalingConfig.parse(workers=workers, mode=mode, batch=batch, steps=steps,
                                 per_node=per_node, quick=quick, outdir=outdir)  # fmt: skip
    finish(lambda: run(config, spec, render, output == Output.json))


def coordinated(
    urls: Annotated[
        str,
        typer.Option(
            help="Each node's Open Inference Protocol endpoint, comma-separated "
            "(host:port for gRPC, http://host:port); node i uses entry i."
        ),
    ],
    model: Annotated[str, typer.Option(help="The model every node queries.")],
    scenario: Annotated[
        str, typer.Option(help="SingleStream, Server or Offline.")
    ] = COORDINATED.scenario,
    target_qps: Annotated[
        float | None, typer.Option(help="Per node. Server: the scheduled rate (required).")
    ] = COORDINATED.target_qps,
    latency_ms: Annotated[
        float, typer.Option(help="Server: the p99 bound in ms.")
    ] = COORDINATED.latency_ms,
    duration: Annotated[
        float, typer.Option(help="Minimum run time per node, seconds.")
    ] = COORDINATED.duration,
    nodes: Annotated[
        int | None, typer.Option(help="Nodes (default: one per URL); on loopback here.")
    ] = COORDINATED.nodes,
    quick: Annotated[bool, typer.Option(help="At most 2 s per node (smoke).")] = COORDINATED.quick,
    spec: Annotated[
        Path | None, typer.Option(help="A TrainingJob giving image, volumes and queue.")
    ] = None,
    render: RenderOption = None,
    outdir: Annotated[
        Path, typer.Option(help="Where coordinated.json and each node's logs go.")
    ] = COORDINATED.outdir,
    output: OutputOption = Output.text,
) -> None:
    """MLPerf LoadGen on every node at once (started together at the rendezvous), merged per
    scenario with per-node rows; exit 1 unless every node is VALID."""
    from gpufleet.bench.coordinated.run import run

    config = CoordinatedConfig.parse(urls=urls, model=model, scenario=scenario,
                                     target_qps=target_qps, latency_ms=latency_ms,
                                     duration=duration, nodes=nodes, quick=quick,
                                     outdir=outdir)  # fmt: skip
    finish(lambda: run(config, spec, render, output == Output.json))


def training(
    runs: Annotated[
        int, typer.Option(help="Timed runs (seeds seed, seed+1, ...); MLPerf scores 5 or more.")
    ] = TRAINING.runs,
    procs: Annotated[int, typer.Option(help="Worker processes per node.")] = TRAINING.procs,
    nodes: Annotated[
        int, typer.Option(help="Nodes (elastic agents; on loopback here).")
    ] = TRAINING.nodes,
    batch_size: Annotated[
        int, typer.Option(help="Samples per worker and step.")
    ] = TRAINING.batch_size,
    lr: Annotated[
        float, typer.Option(help="Peak learning rate (SGD, cosine decay).")
    ] = TRAINING.lr,
    max_epochs: Annotated[
        int, typer.Option(help="A run that has not reached the target by then is aborted.")
    ] = TRAINING.max_epochs,
    seed: Annotated[int, typer.Option(help="The first run's seed.")] = TRAINING.seed,
    strategy: Annotated[str | None, typer.Option(help=STRATEGY_HELP)] = TRAINING.strategy,
    precision: Annotated[str | None, typer.Option(help=PRECISION_HELP)] = TRAINING.precision,
    quick: Annotated[bool, typer.Option(help="Smoke run: one run (seconds).")] = TRAINING.quick,
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
    ] = TRAINING.results,
    outdir: Annotated[
        Path, typer.Option(help="Where training.json, training.png and the logs go.")
    ] = TRAINING.outdir,
    output: OutputOption = Output.text,
) -> None:
    """MLPerf Training-style time to target: the digits CNN to 97% test accuracy on every node
    at once, MLLOG lines from mlperf-logging, each run checked by its compliance checker and
    the set scored as MLPerf does; exit 1 unless the result is valid."""
    from gpufleet.bench.training.run import run

    config = TrainingConfig(runs=runs, procs=procs, nodes=nodes, batch_size=batch_size, lr=lr,
                            max_epochs=max_epochs, seed=seed, strategy=strategy,
                            precision=precision, quick=quick, results=results,
                            outdir=outdir)  # fmt: skip
    finish(lambda: run(config, spec, render, output == Output.json))


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
    from gpufleet.bench.collect import collect as collect_results

    finish(lambda: collect_results(results, outdir, output == Output.json))
