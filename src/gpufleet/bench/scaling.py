"""``gpufleet bench scaling``: how training throughput grows with workers, and a predictor.

The worker (``python -m gpufleet.bench.scaling`` under gpufleet's launcher, one run per
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

The predictor is the alpha-beta model of a ring all-reduce:
``T_ar(p, M) = 2(p-1) alpha + 2 (p-1)/p M / B``, with the link's latency ``alpha`` and bus
bandwidth ``B``. A step at p workers takes ``T(p) = compute(p) + data(p) + (1 - h) T_ar(p, M)``:
- ``M`` is the gradient bytes;
- ``compute`` is the measured single-worker compute, divided by p under strong scaling;
- ``h`` is the fraction of the all-reduce hidden behind backward, measured at the largest
  world size here.

``alpha`` and ``B`` are fitted to all-reduce times measured in the same run
(``fit_alpha_beta``), or taken from an interconnect's nominal figures (INTERCONNECTS).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Nominal figures of common interconnects: per-GPU all-reduce bus bandwidth (GB/s, what
# nccl-tests reaches, below the link's line rate) and latency per ring step (seconds).
# Assumptions, not measurements: NVLink 4 within one 8-GPU H100 node (beyond 8 GPUs a ring
# leaves the node and runs at the network's speed); InfiniBand HDR (200 Gb/s per GPU, GPUDirect
# RDMA); 25 GbE (TCP, one NIC per node shared by its GPUs is worse still).
INTERCONNECTS: dict[str, tuple[float, float]] = {
    "nvlink": (360.0, 3e-6),
    "infiniband-hdr": (22.0, 6e-6),
    "25gbe": (2.8, 30e-6),
}


@dataclass
class Point:
    """One measured world size."""

    mode: str  # strong | weak
    world: int
    global_batch: int
    step_seconds: float
    compute_seconds: float
    data_seconds: float
    communication_seconds: float
    samples_per_second: float
    gradient_bytes: int
    efficiency: float = 1.0
    nodes: int = 1  # the world size spread over this many nodes


def ring_allreduce_seconds(p: int, nbytes: float, bandwidth_gbps: float, alpha: float) -> float:
    """The alpha-beta time of a ring all-reduce of ``nbytes`` over ``p`` ranks."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / (bandwidth_gbps * 1e9)


def fit_alpha_beta(p: int, sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(bus bandwidth GB/s, alpha seconds) of a least-squares line through measured ring
    all-reduce times at ``p`` ranks: ``t = 2(p-1) alpha + [2(p-1)/p / B] bytes``."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds, strict=True)) / sxx
    if slope <= 0:  # noise swamped the size dependence: bound it by the best observed rate
        best = max(2 * (p - 1) / p * x / y for x, y in zip(sizes, seconds, strict=True))
        return best / 1e9, min(seconds) / (2 * (p - 1))
    intercept = max(0.0, my - slope * mx)
    return 2 * (p - 1) / p / slope / 1e9, intercept / (2 * (p - 1))


@dataclass(frozen=True)
class Model:
    """What the predictor knows: the single-worker step, the hidden fraction, the link."""

    compute1: float  # seconds of compute at 1 worker and the reference per-worker batch
    data1: float
    gradient_bytes: int
    hidden: float  # fraction of the all-reduce hidden behind backward
    bandwidth_gbps: float
    alpha: float

    def step(self, p: int, mode: str) -> float:
        """Predicted seconds per step at ``p`` workers."""
        share = 1 / p if mode == "strong" else 1.0
        comm = ring_allreduce_seconds(p, self.gradient_bytes, self.bandwidth_gbps, self.alpha)
        return (self.compute1 + self.data1) * share + (1 - self.hidden) * comm

    def efficiency(self, p: int, mode: str) -> float:
        """Predicted throughput_p / (p x throughput_1)."""
        t1 = self.step(1, mode)
        tp = self.step(p, mode)
        return t1 / (p * tp) if mode == "strong" else t1 / tp


def hidden_fraction(point: Point, bandwidth_gbps: float, alpha: float) -> float:
    """The share of the modeled all-reduce that the measured step hid (0..1)."""
    modeled = ring_allreduce_seconds(point.world, point.gradient_bytes, bandwidth_gbps, alpha)
    if modeled <= 0:
        return 0.0
    return min(1.0, max(0.0, 1 - point.communication_seconds / modeled))


def efficiencies(points: list[Point]) -> None:
    """Fill in each point's efficiency against its mode's 1-worker point."""
    for mode in {p.mode for p in points}:
        base = next(p for p in points if p.mode == mode and p.world == 1)
        for p in points:
            if p.mode == mode:
                p.efficiency = p.samples_per_second / (p.world * base.samples_per_second)


# ---- the worker ---------------------------------------------------------------------------


def _median_slowest(values: list[float], device: Any) -> float:
    from gpufleet.bench.collectives import slowest

    return slowest(statistics.median(values), device)


def run_point(args: argparse.Namespace) -> dict[str, Any]:
    """Measure this world size (every rank calls it); returns rank 0's view."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from gpufleet.bench.collectives import OPS, measure
    from gpufleet.bench.system import nodes_of
    from gpufleet.runtime.data import GlobalBatchSampler
    from gpufleet.runtime.distributed import ensure_process_group, init_distributed
    from gpufleet.runtime.rng import seed_everything
    from gpufleet.workloads.synthetic import parameter_bytes, synthetic_dataset, synthetic_mlp

    info = init_distributed()
    ensure_process_group()
    world = info.world_size
    global_batch = args.batch if args.mode == "strong" else args.batch * world
    seed_everything(0)
    model = synthetic_mlp(args.input_size, args.hidden_size, args.layers).to(info.device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    samples = global_batch * (2 * args.steps + args.warmup)  # one pass: every step a new batch
    data = synthetic_dataset(samples, args.input_size, seed=0)
    sampler = GlobalBatchSampler(
        len(data), global_batch=global_batch, num_replicas=world, rank=info.rank
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
    step_s = _median_slowest([t for t, _ in timed[True]], info.device)
    compute_s = _median_slowest([t - d for t, d in timed[False]], info.device)
    data_s = _median_slowest([d for _, d in timed[True]], info.device)
    grad_bytes = parameter_bytes(model)
    out: dict[str, Any] = {
        "point": asdict(
            Point(
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
        ),
    }
    if world > 1 and args.fit:  # the link here: all-reduce times for the alpha-beta fit
        # Around the gradient's size, where the step's all-reduce runs (rounded to floats).
        sizes = sorted({max(4096, (grad_bytes >> k) // 4 * 4) for k in (6, 4, 2, 1, 0)})
        rows = [
            measure(OPS["all_reduce"], "in-place", s, info.device, min_seconds=0.05, max_iters=20)
            for s in sizes
        ]
        out["allreduce"] = {
            "ranks": world,
            "bytes": [r.bytes for r in rows],
            "seconds": [r.seconds for r in rows],
        }
    dist.barrier()
    return out


def main(argv: list[str] | None = None) -> int:
    """One world size's measurement; rank 0 writes ``$GPUFLEET_RUN_DIR/scaling.json``."""
    from gpufleet.runtime.distributed import init_distributed
    from gpufleet.runtime.files import write_json_atomic

    parser = argparse.ArgumentParser(prog="python -m gpufleet.bench.scaling")
    parser.add_argument("--mode", choices=("strong", "weak"), default="strong")
    parser.add_argument("--batch", type=int, default=256, help="strong: global; weak: per worker")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--input-size", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
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


if __name__ == "__main__":
    sys.exit(main())


# ---- analysis and output (the CLI's side) -------------------------------------------------

PREDICT_AT = (4, 8, 16, 64)


def analyze(points: list[Point], allreduce: dict[str, Any] | None) -> dict[str, Any]:
    """Efficiencies, the fitted link, and the predictor checked against every measured point
    and extrapolated to PREDICT_AT workers on this link and each of INTERCONNECTS."""
    efficiencies(points)
    if allreduce:
        bandwidth, alpha = fit_alpha_beta(
            allreduce["ranks"], allreduce["bytes"], allreduce["seconds"]
        )
    else:  # one worker only: nothing to fit; the nominal 25 GbE figures stand in
        bandwidth, alpha = INTERCONNECTS["25gbe"]
    out: dict[str, Any] = {
        "link": {"bandwidth_gbps": bandwidth, "alpha_seconds": alpha},
        "modes": {},
    }
    for mode in sorted({p.mode for p in points}):
        mine = sorted((p for p in points if p.mode == mode), key=lambda p: p.world)
        one, widest = mine[0], mine[-1]
        hidden = hidden_fraction(widest, bandwidth, alpha)
        model = Model(
            one.compute_seconds, one.data_seconds, one.gradient_bytes, hidden, bandwidth, alpha
        )
        checks = [
            {
                "world": p.world,
                "measured": p.efficiency,
                "predicted": model.efficiency(p.world, mode),
                "error": model.efficiency(p.world, mode) - p.efficiency,
            }
            for p in mine
        ]
        links = {"here": model}
        for name, (bw, a) in INTERCONNECTS.items():
            links[name] = Model(
                one.compute_seconds, one.data_seconds, one.gradient_bytes, hidden, bw, a
            )
        out["modes"][mode] = {
            "hidden_fraction": hidden,
            "checks": checks,
            "max_abs_error": max(abs(c["error"]) for c in checks),
            "predicted": {
                name: {str(p): m.efficiency(p, mode) for p in PREDICT_AT}
                for name, m in links.items()
            },
        }
    return out


def table(points: list[Point], analysis: dict[str, Any]) -> list[str]:
    """The measured points, their prediction check, and the predictions, as text lines."""
    lines = [
        f"{'mode':<7}{'workers':>8}{'nodes':>6}{'batch':>7}{'samples/s':>11}{'eff':>7}"
        f"{'pred':>7}{'step ms':>9}{'compute':>9}{'data':>7}{'comm':>8}"
    ]
    for p in sorted(points, key=lambda p: (p.mode, p.world)):
        check = next(c for c in analysis["modes"][p.mode]["checks"] if c["world"] == p.world)
        lines.append(
            f"{p.mode:<7}{p.world:>8}{p.nodes:>6}{p.global_batch:>7}{p.samples_per_second:>11.0f}"
            f"{p.efficiency:>7.3f}{check['predicted']:>7.3f}{p.step_seconds * 1e3:>9.1f}"
            f"{p.compute_seconds * 1e3:>9.1f}{p.data_seconds * 1e3:>7.1f}"
            f"{p.communication_seconds * 1e3:>8.1f}"
        )
    link = analysis["link"]
    lines += [
        "",
        f"link here (alpha-beta fit of all-reduce): {link['bandwidth_gbps']:.2f} GB/s "
        f"bus bandwidth, alpha {link['alpha_seconds'] * 1e6:.0f} us",
    ]
    for mode, m in analysis["modes"].items():
        lines += [
            "",
            f"{mode} scaling: predicted efficiency (model error at measured points: "
            f"max {m['max_abs_error']:.3f}; hidden all-reduce fraction "
            f"{m['hidden_fraction']:.2f})",
            f"{'interconnect':<16}" + "".join(f"{p:>8}" for p in PREDICT_AT),
        ]
        for name, effs in m["predicted"].items():
            lines.append(f"{name:<16}" + "".join(f"{effs[str(p)]:>8.3f}" for p in PREDICT_AT))
    return lines


def plot(points: list[Point], analysis: dict[str, Any], path: Path) -> None:
    """Efficiency against workers: measured points and predicted curves, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted(analysis["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    xs = [1, 2, *PREDICT_AT]
    for ax, mode in zip(axes[0], modes, strict=True):
        m = analysis["modes"][mode]
        for name, effs in m["predicted"].items():
            checks = {c["world"]: c["predicted"] for c in m["checks"]} if name == "here" else {}
            ys = [checks.get(x, effs.get(str(x), float("nan"))) for x in xs]
            ax.plot(xs, ys, marker=".", label=f"predicted: {name}")
        mine = [p for p in points if p.mode == mode]
        ax.plot([p.world for p in mine], [p.efficiency for p in mine], "ko", label="measured")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("workers")
        ax.set_ylabel("efficiency")
        ax.set_title(f"{mode} scaling")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
