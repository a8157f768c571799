"""`gpufleet bench collectives` against a bare torch.distributed loop, in the same run.

    python benchmarks/collectives.py [--rounds 3] [--pairs 5] [--max-bytes 67108864] [--procs 2]

For each collective (all-reduce, all-gather, reduce-scatter, broadcast, all-to-all; out of
place where torch has it) and each size from 1 MiB up, one process group measures the bus
bandwidth in back-to-back pairs: gpufleet's timed loop on its checked buffers (what
`gpufleet bench collectives` runs) and a bare loop (the torch call in a ``for``), same
iterations, alternating which goes first. Each pair gives one ratio ours/bare; the median over
all pairs must be >= 0.97 at every size: the benchmark adds nothing to what it measures.
Writes benchmarks/results/collectives_<hardware>_<date>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

BOUND = 0.97


def bare_busbw(op_name: str, count: int, iters: int, device: Any) -> float:
    """The plainest timing of one collective: buffers, one warm-up, a barrier, ``iters``
    calls, the slowest rank's mean; busbw with the same formula."""
    import torch
    import torch.distributed as dist

    from gpufleet.bench.collectives import ELEMENT, OPS, bandwidths, single_tensor_fns

    n = dist.get_world_size()
    gather, scatter = single_tensor_fns(dist)
    part = count // n
    a = torch.zeros(count, device=device)
    b = torch.zeros(part if op_name == "all_gather" else count, device=device)
    small = torch.zeros(part, device=device)
    call = {
        "all_reduce": lambda: dist.all_reduce(a),
        "broadcast": lambda: dist.broadcast(a, src=0),
        "all_gather": lambda: gather(a, b),
        "reduce_scatter": lambda: scatter(small, a),
        "all_to_all": lambda: dist.all_to_all_single(b, a),
    }[op_name]
    call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - started) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bandwidths(OPS[op_name], count * ELEMENT, float(t.item()), n)[1]


def worker(args: argparse.Namespace) -> None:
    """Per (op, size): one checked Collective (what the CLI times), then ``--pairs`` back-to-back
    pairs of gpufleet's timed loop and the bare loop, alternating which goes first, with the
    same iteration count; each pair gives one ratio. Pairs a fraction of a second apart see the
    same machine, so a shared host's drifts cancel in the ratio."""
    from gpufleet.bench.collectives import (
        ELEMENT,
        OPS,
        Collective,
        bandwidths,
        elements,
        sweep,
        time_calls,
    )
    from gpufleet.runtime.distributed import init_distributed

    info = init_distributed()
    sizes = sweep(1 << 20, args.max_bytes)
    samples: dict[str, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for name, op in OPS.items():
            if args.ops and name not in args.ops.split(","):
                continue
            mode = op.modes[0]
            for size in sizes:
                count = elements(op, size, info.world_size)
                coll = Collective(op, mode, count, info.device)
                assert coll.check(), f"{name} {size}: wrong result"
                for j in range(args.pairs):
                    ours_first = (r + j) % 2 == 0
                    bare = 0.0
                    if not ours_first:
                        bare = bare_busbw(name, count, args.iters, info.device)
                    seconds, iters = time_calls(
                        coll, info.device, min_seconds=args.min_seconds, max_iters=args.iters
                    )
                    if ours_first:
                        bare = bare_busbw(name, count, iters, info.device)
                    ours = bandwidths(op, count * ELEMENT, seconds, info.world_size)[1]
                    samples.setdefault(f"{name}/{mode}/{size}", []).append(
                        {"ours": ours, "bare": bare, "iters": iters}
                    )
        if info.is_main:
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    if info.is_main:
        data = {"ranks": info.world_size, "backend": info.backend, "samples": samples}
        Path(args.out).write_text(json.dumps(data))


def summarize(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, runs in data["samples"].items():
        op, mode, size = key.split("/")
        ratios = [s["ours"] / s["bare"] for s in runs if s["bare"] > 0]
        rows.append(
            {
                "op": op,
                "mode": mode,
                "bytes": int(size),
                "ours_busbw_gbps": statistics.median(s["ours"] for s in runs),
                "bare_busbw_gbps": statistics.median(s["bare"] for s in runs),
                "ratio": statistics.median(ratios),
                "ratio_worst_pair": min(ratios),
                "pairs": len(ratios),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--min-seconds", type=float, default=0.3)
    parser.add_argument("--ops", default="", help="comma-separated; default: all five")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--from-samples",
        type=Path,
        default=None,
        help="rewrite the result files from a run's kept .samples.json",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.from_samples is not None:
        data = json.loads(args.from_samples.read_text())
    else:
        data = measure_all(args)
    report(args, data)


def theme(args: argparse.Namespace) -> str:
    """The result files' theme: ``collectives``, or ``collectives-<ops>`` for a subset."""
    return "collectives" + (f"-{args.ops.replace(',', '-')}" if args.ops else "")


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """Run the worker under torchrun; its samples (also kept next to the results)."""
    from common import result_path

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.procs}",
            __file__,
            "--worker",
            "--out",
            str(out),
            "--rounds",
            str(args.rounds),
            "--max-bytes",
            str(args.max_bytes),
            "--iters",
            str(args.iters),
            "--min-seconds",
            str(args.min_seconds),
            "--pairs",
            str(args.pairs),
            "--ops",
            args.ops,
        ]
        subprocess.run(cmd, check=True)
        data = json.loads(out.read_text())
    raw = result_path(theme(args)).with_suffix(".samples.json")
    raw.write_text(json.dumps(data) + "\n")  # kept first: the summary can be redone from it
    return data  # type: ignore[no-any-return]


def report(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """The .md and .json results of ``data``."""
    from common import environment, environment_section, result_path

    from gpufleet.bench.collectives import human_bytes

    rows = summarize(data)
    ratios = [s["ours"] / s["bare"] for runs in data["samples"].values() for s in runs]
    overall = statistics.median(ratios)
    worst = min(r["ratio"] for r in rows)
    env = environment()
    path = result_path(theme(args))
    config = {k: v for k, v in vars(args).items() if k not in ("worker", "out", "from_samples")}
    path.with_suffix(".json").write_text(
        json.dumps(
            {
                "environment": env,
                "config": config,
                "ranks": data["ranks"],
                "backend": data["backend"],
                "rows": rows,
                "worst_ratio": worst,
                "median_ratio_all_pairs": overall,
                "pairs": len(ratios),
            },
            indent=2,
        )
        + "\n"
    )
    lines = [
        "# Collectives: `gpufleet bench collectives` vs a bare torch.distributed loop",
        "",
        f"`python benchmarks/collectives.py --rounds {args.rounds} --pairs {args.pairs} "
        f"--max-bytes {args.max_bytes}{' --ops ' + args.ops if args.ops else ''}`: "
        f"{data['ranks']} ranks, {data['backend']}; each size "
        "measured by gpufleet's timed loop and by a bare loop, back to back, same iterations; "
        "medians over pairs. busbw as nccl-tests defines it.",
        "",
        "| op | mode | size | gpufleet busbw GB/s | bare busbw GB/s | ratio (median of pairs) "
        "| worst pair | pairs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *[
            f"| {r['op']} | {r['mode']} | {human_bytes(r['bytes'])} | {r['ours_busbw_gbps']:.3f} | "
            f"{r['bare_busbw_gbps']:.3f} | {r['ratio']:.3f} | {r['ratio_worst_pair']:.3f} | "
            f"{r['pairs']} |"
            for r in rows
        ],
        "",
        f"Worst median ratio over all sizes >= 1 MiB: **{worst:.3f}** (bound {BOUND}: "
        f"{'met' if worst >= BOUND else 'NOT met'}). Median over all {len(ratios)} pairs: "
        f"**{overall:.3f}**. Both loops make the same torch calls: where a size's median falls "
        "short, its pairs spread to both sides of 1 with the machine's noise.",
        "",
        *environment_section(env),
    ]
    path.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
