"""The worker of ``gpufleet bench coordinated``: MLPerf LoadGen on every node at once.

One worker per node runs under gpufleet's launcher, locally (N agents on loopback) or as the
pods of a rendered job. The c10d rendezvous that forms the group is the start line: after it, a
barrier, and every node starts its LoadGen run against its own endpoint (``--urls``; node i
takes entry i). Every node's result is gathered to rank 0 over the process group. Rank 0 merges
them per scenario (gpufleet.bench.coordinated.report.merge) and writes ``coordinated.json``:
one row per node with its validity, plus the aggregate. Each node's LoadGen logs stay in
``<outdir>/node-<i>/``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpufleet.bench.coordinated.config import LOADGEN_DEFAULTS
from gpufleet.bench.coordinated.report import merge


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The worker's options; their defaults are LoadGen's (BenchConfig)."""
    defaults = LOADGEN_DEFAULTS
    parser = argparse.ArgumentParser(prog="python -m gpufleet.bench.coordinated")
    parser.add_argument("--urls", required=True, help="one endpoint per node, comma-separated")
    parser.add_argument("--model", required=True)
    parser.add_argument("--scenario", default=defaults.scenario)
    parser.add_argument("--target-qps", type=float, default=defaults.target_qps)
    parser.add_argument("--latency-ms", type=float, default=defaults.latency_ms)
    parser.add_argument("--duration", type=float, default=defaults.duration)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--outdir", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """This node's LoadGen run; rank 0 writes the merged ``coordinated.json``."""
    args = parse(argv)

    import torch.distributed as dist

    from gpufleet.bench.system import describe
    from gpufleet.runtime.distributed import ensure_process_group, init_distributed
    from gpufleet.runtime.files import write_json_atomic
    from gpufleet.serve.loadgen import BenchConfig, run_bench
    from gpufleet.serve.loadgen.run import RERUN_FACTOR, rerun_rate, say_rerun

    info = init_distributed()
    ensure_process_group()
    urls = [u.strip() for u in args.urls.split(",") if u.strip()]
    outdir = args.outdir or Path(os.environ.get("GPUFLEET_RUN_DIR", ".")) / "coordinated"
    cfg = BenchConfig(
        url=urls[info.rank % len(urls)],
        model=args.model,
        scenario=args.scenario,
        target_qps=args.target_qps,
        latency_ms=args.latency_ms,
        duration=args.duration,
        quick=args.quick,
        outdir=outdir / f"node-{info.rank}",
    )
    started = [0.0]

    def start_line() -> None:
        # After each node has measured its endpoint (Offline's expected rate, SingleStream's
        # latency): the runs start together, whatever each measurement took.
        dist.barrier()  # the start line: every node's LoadGen begins now
        started[0] = time.time()

    def run(cfg: BenchConfig) -> list[dict[str, Any]]:
        """This node's run, and every node's as gathered (the same list on every node)."""
        result = run_bench(cfg, start_line, again=False).to_json()
        mine = {**result, "node": info.rank, "started": started[0], "system": describe()}
        gathered: list[Any] = [None] * info.world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    gathered = run(cfg)
    # An Offline node that ran short (rerun_rate) makes every node run again, each expecting
    # RERUN_FACTOR times its own rate: the second runs still start together, as the first did.
    if any(rerun_rate(cfg, n) for n in gathered):
        own = gathered[info.rank]
        rate = RERUN_FACTOR * max(own["samples_per_second"] or 0.0, 1.0)
        if rerun_rate(cfg, own):
            say_rerun(own, rate)
        gathered = run(replace(cfg, target_qps=rate))
    if info.is_main:
        merged = {"aggregate": merge(args.scenario, gathered), "nodes": gathered}
        write_json_atomic(outdir / "coordinated.json", merged)
        print(f"coordinated {args.scenario}: {merged['aggregate']}", flush=True)
    return 0 if all(n["valid"] for n in gathered) else 1
