"""The scaling model of ``gpufleet bench scaling``: measured points, efficiency, and the
alpha-beta predictor (pure).

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

from dataclasses import dataclass
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
