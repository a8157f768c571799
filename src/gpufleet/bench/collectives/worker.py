"""The worker of ``gpufleet bench collectives`` (``python -m gpufleet.bench.collectives``
under gpufleet's launcher, locally or in pods): every op, mode and size checked, then timed.
Time is the slowest rank's mean per iteration (a collective ends when its last rank does).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpufleet.bench.collectives.config import CollectivesConfig
from gpufleet.bench.collectives.ops import ELEMENT, OPS, Op, Row, bandwidths, elements, sweep
from gpufleet.bench.collectives.report import HEADER, format_row
from gpufleet.torchapi import single_tensor_fns as single_tensor_fns


class Collective:
    """Buffers and one call of ``op`` in ``mode`` over ``count`` elements on ``device``."""

    def __init__(self, op: Op, mode: str, count: int, device: Any) -> None:
        import torch
        import torch.distributed as dist

        self.op, self.mode, self.count = op, mode, count
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.dist = dist
        self.gather, self.scatter = single_tensor_fns(dist)
        part = count // self.n if op.split() else count
        self.part = part
        if op.name == "all_gather":
            self.out = torch.zeros(count, device=device)
            self.inp = (
                self.out.narrow(0, self.rank * part, part)
                if mode == "in-place"
                else torch.zeros(part, device=device)
            )
        elif op.name == "reduce_scatter":
            self.inp = torch.zeros(count, device=device)
            self.out = (
                self.inp.narrow(0, self.rank * part, part)
                if mode == "in-place"
                else torch.zeros(part, device=device)
            )
        elif op.name == "all_to_all":
            self.inp, self.out = (
                torch.zeros(count, device=device),
                torch.zeros(count, device=device),
            )
        else:
            self.inp = self.out = torch.zeros(count, device=device)

    def __call__(self) -> None:
        name, d = self.op.name, self.dist
        if name == "all_reduce":
            d.all_reduce(self.inp)
        elif name == "broadcast":
            d.broadcast(self.inp, src=0)
        elif name == "all_gather":
            self.gather(self.out, self.inp)
        elif name == "reduce_scatter":
            self.scatter(self.out, self.inp)
        else:
            d.all_to_all_single(self.out, self.inp)

    def check(self) -> bool:
        """Fill the input with a per-rank pattern of small integers (exact in float32 sums),
        run once, compare the output with what the collective must give."""
        import torch

        n, r, part = self.n, self.rank, self.part
        idx = torch.arange(self.inp.numel(), device=self.inp.device, dtype=torch.float32)

        def pattern(rank: int, at: torch.Tensor) -> torch.Tensor:
            return (at % 13) + rank * 17 + 1

        name = self.op.name
        if name == "all_gather":
            self.out.zero_()
            self.inp.copy_(pattern(r, idx))
            want = pattern_parts(pattern, n, part, self.inp.device)
        elif name == "reduce_scatter":
            full = torch.arange(self.count, device=self.inp.device, dtype=torch.float32)
            self.inp.copy_(pattern(r, full))
            want = sum(pattern(k, full) for k in range(n)).narrow(0, r * part, part)  # type: ignore[union-attr]
        elif name == "all_to_all":
            self.inp.copy_(pattern(r, idx))
            mine = torch.arange(
                r * part, (r + 1) * part, device=self.inp.device, dtype=torch.float32
            )
            want = torch.cat([pattern(k, mine) for k in range(n)])
        elif name == "broadcast":
            self.inp.copy_(pattern(r, idx))
            want = pattern(0, idx)
        else:
            self.inp.copy_(pattern(r, idx))
            want = sum(pattern(k, idx) for k in range(n))
        self()
        _sync(self.inp.device)
        ok = bool(torch.equal(self.out, want))
        self.inp.zero_()
        self.out.zero_()
        return ok


def pattern_parts(pattern: Callable[..., Any], n: int, part: int, device: Any) -> Any:
    """An all-gather's expected output: rank k's pattern over its own ``part`` elements."""
    import torch

    idx = torch.arange(part, device=device, dtype=torch.float32)
    return torch.cat([pattern(k, idx) for k in range(n)])


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def slowest(value: float, device: Any) -> float:
    """The largest ``value`` over all ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_calls(
    fn: Callable[[], None], device: Any, *, min_seconds: float, max_iters: int, warmup: int = 1
) -> tuple[float, int]:
    """Mean seconds per call of ``fn`` (the slowest rank's) and the iterations timed: after
    ``warmup`` calls, as many as fill ``min_seconds`` by the warm-up's pace, agreed by all
    ranks, between 1 and ``max_iters``."""
    import torch.distributed as dist

    started = time.perf_counter()
    for _ in range(warmup):
        fn()
    _sync(device)
    pace = slowest((time.perf_counter() - started) / max(1, warmup), device)
    iters = int(max(1, min(max_iters, min_seconds / pace if pace > 0 else max_iters)))
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return slowest((time.perf_counter() - started) / iters, device), iters


def measure(
    op: Op, mode: str, size: int, device: Any, *, min_seconds: float, max_iters: int
) -> Row:
    """Check, then time, one (op, mode, size)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    count = elements(op, size, n)
    coll = Collective(op, mode, count, device)
    correct = coll.check()
    seconds, iters = time_calls(coll, device, min_seconds=min_seconds, max_iters=max_iters)
    nbytes = count * ELEMENT
    algbw, busbw = bandwidths(op, nbytes, seconds, n)
    ok = slowest(0.0 if correct else 1.0, device) == 0.0  # wrong on any rank: wrong
    return Row(op.name, mode, nbytes, count, n, seconds, algbw, busbw, ok, iters)


def run_sweep(
    ops: list[str],
    sizes: list[int],
    *,
    min_seconds: float,
    max_iters: int,
    log: Callable[[str], None] | None = None,
) -> list[Row]:
    """Every op, mode and size, in that order; the process group must be up."""
    from gpufleet.runtime.distributed import init_distributed

    device = init_distributed().device
    rows = []
    for name in ops:
        op = OPS[name]
        for mode in op.modes:
            for size in sizes:
                row = measure(op, mode, size, device, min_seconds=min_seconds, max_iters=max_iters)
                rows.append(row)
                if log is not None:
                    log(format_row(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the sweep in this worker; rank 0 prints the table and writes the JSON result
    (``--out``, else ``$GPUFLEET_RUN_DIR/collectives.json``)."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet.bench.collectives")
    defaults = CollectivesConfig()
    parser.add_argument("--ops", default=",".join(defaults.ops))
    parser.add_argument("--min-bytes", type=int, default=defaults.min_bytes)
    parser.add_argument("--max-bytes", type=int, default=defaults.top())
    parser.add_argument("--factor", type=int, default=defaults.factor)
    parser.add_argument("--min-seconds", type=float, default=defaults.min_seconds)
    parser.add_argument("--max-iters", type=int, default=defaults.max_iters)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--results", default=None, help="also publish there (dir or URI)")
    args = parser.parse_args(argv)
    from gpufleet.bench.system import node_systems
    from gpufleet.runtime.distributed import ensure_process_group, init_distributed
    from gpufleet.runtime.files import write_json_atomic

    info = init_distributed()
    ensure_process_group()
    log = print if info.is_main else None
    if log:
        log(HEADER)
    rows = run_sweep(
        args.ops.split(","),
        sweep(args.min_bytes, args.max_bytes, args.factor),
        min_seconds=args.min_seconds,
        max_iters=args.max_iters,
        log=log,
    )
    systems = node_systems()
    if info.is_main:
        out = args.out or Path(os.environ.get("GPUFLEET_RUN_DIR", ".")) / "collectives.json"
        write_json_atomic(
            out,
            {
                "ranks": info.world_size,
                "backend": info.backend,
                "rows": [asdict(r) for r in rows],
                "systems": systems,  # one per node
            },
        )
        if args.results:  # a cluster run: where `gpufleet bench collect` reads it
            from gpufleet.bench.jobs import publish

            publish([out], args.results)
    return 0 if all(r.correct for r in rows) else 1
