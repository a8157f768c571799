"""The worker of ``gpufleet bench scaling``: one world size measured.

It (``python -m gpufleet.bench.scaling`` under gpufleet's launcher, one run per
world size) trains the synthetic MLP with DDP and times three things per step, each the
slowest rank's median over the timed steps:

* ``step``: a whole training step (data, forward, backward with the gradient all-reduce,
  optimizer);
* ``compute``: the same step under DDP's ``no_sync()`` (no all-reduce), so
  ``communication = step - compute - data`` is the all-reduce time the step could not hide
  behind backward (the exposed part: what slows training);
* ``data``: fetching the step's batch from the DataLoader.

torch.profiler's CPU view was not used for the split: it shows a gloo all-reduce from enqueue
to completion, overlapped with backward, which is not the time it costs the step.

Strong scaling keeps the global batch and splits it; weak scaling keeps the per-worker batch.
Efficiency is ``throughput_N / (N x throughput_1)``.

"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpufleet.bench.scaling.config import MODES, ScalingConfig
from gpufleet.bench.scaling.model import Point


def _median_slowest(values: list[float], device: Any) -> float:
    from gpufleet.bench.collectives.worker import slowest

    return slowest(statistics.median(values), device)


def _timed_steps(
    args: argparse.Namespace, info: Any, global_batch: int
) -> tuple[dict[bool, list[tuple[float, float]]], int]:
    """(seconds, data seconds) of each timed step with (True) and without (False) the
    gradient all-reduce, and the gradient bytes."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from gpufleet.runtime.data import GlobalBatchSampler
    from gpufleet.runtime.rng import seed_everything
    from gpufleet.workloads.synthetic import parameter_bytes, synthetic_dataset, synthetic_mlp

    seed_everything(0)
    model = synthetic_mlp(args.input_size, args.hidden_size, args.layers).to(info.device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    samples = global_batch * (2 * args.steps + args.warmup)  # one pass: every step a new batch
    data = synthetic_dataset(samples, args.input_size, seed=0)
    sampler = GlobalBatchSampler(
        len(data), global_batch=global_batch, num_replicas=info.world_size, rank=info.rank
    )
    batches = iter(DataLoader(data, batch_sampler=sampler, num_workers=0))

    def step(sync: bool) -> tuple[float, float]:
        started = time.perf_counter()
        x, y = next(batches)
        fetched = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ddp.no_sync() if not sync else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(ddp(x.to(info.device)), y.to(info.device))
            loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if info.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, fetched - started

    timed: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(args.warmup + 2 * args.steps):
        sync = i % 2 == 0  # alternate, so both see the same machine
        result = step(sync)
        if i >= args.warmup:
            timed[sync].append(result)
    return timed, parameter_bytes(model)


def _allreduce_times(grad_bytes: int, info: Any) -> dict[str, Any]:
    """All-reduce times at sizes around the gradient's, for the alpha-beta fit of the link."""
    from gpufleet.bench.collectives.ops import OPS
    from gpufleet.bench.collectives.worker import measure

    # Around the gradient's size, where the step's all-reduce runs (rounded to floats).
    sizes = sorted({max(4096, (grad_bytes >> k) // 4 * 4) for k in (6, 4, 2, 1, 0)})
    rows = [
        measure(OPS["all_reduce"], "in-place", s, info.device, min_seconds=0.05, max_iters=20)
        for s in sizes
    ]
    return {
        "ranks": info.world_size,
        "bytes": [r.bytes for r in rows],
        "seconds": [r.seconds for r in rows],
    }


def run_point(args: argparse.Namespace) -> dict[str, Any]:
    """Measure this world size (every rank calls it); returns rank 0's view."""
    import torch.distributed as dist

    from gpufleet.bench.system import nodes_of
    from gpufleet.runtime.distributed import ensure_process_group, init_distributed

    info = init_distributed()
    ensure_process_group()
    world = info.world_size
    global_batch = args.batch if args.mode == "strong" else args.batch * world
    timed, grad_bytes = _timed_steps(args, info, global_batch)
    step_s = _median_slowest([t for t, _ in timed[True]], info.device)
    compute_s = _median_slowest([t - d for t, d in timed[False]], info.device)
    data_s = _median_slowest([d for _, d in timed[True]], info.device)
    point = Point(
        args.mode,
        world,
        global_batch,
        step_s,
        compute_s,
        data_s,
        max(0.0, step_s - compute_s - data_s),
        global_batch / step_s,
        grad_bytes,
        nodes=nodes_of(world),
    )
    out: dict[str, Any] = {"point": asdict(point)}
    if world > 1 and args.fit:  # the link here: all-reduce times for the alpha-beta fit
        out["allreduce"] = _allreduce_times(grad_bytes, info)
    dist.barrier()
    return out


def main(argv: list[str] | None = None) -> int:
    """One world size's measurement; rank 0 writes ``$GPUFLEET_RUN_DIR/scaling.json``."""
    from gpufleet.runtime.distributed import init_distributed
    from gpufleet.runtime.files import write_json_atomic

    parser = argparse.ArgumentParser(prog="python -m gpufleet.bench.scaling")
    defaults = ScalingConfig()
    parser.add_argument("--mode", choices=MODES["both"], default=MODES["both"][0])
    parser.add_argument(
        "--batch", type=int, default=defaults.batch, help="strong: global; weak: per worker"
    )
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument("--input-size", type=int, default=defaults.input_size)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--fit", action="store_true", help="also time all-reduce for alpha-beta")
    parser.add_argument("--results", default=None, help="also publish there (dir or URI)")
    args = parser.parse_args(argv)
    result = run_point(args)
    info = init_distributed()
    if info.is_main:
        run_dir = Path(os.environ.get("GPUFLEET_RUN_DIR", "."))
        write_json_atomic(run_dir / "scaling.json", result)
        if args.results:  # a cluster run: `gpufleet bench collect` assembles the points
            from gpufleet.bench.jobs import publish

            named = run_dir / point_file(args.mode, info.world_size)
            write_json_atomic(named, result)
            publish([named], args.results)
    return 0


def point_file(mode: str, world: int) -> str:
    """The name one rendered point publishes under: ``point-<mode>-<world>.json``."""
    return f"point-{mode}-{world:05d}.json"
