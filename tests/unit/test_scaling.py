"""gpufleet bench scaling's model: the alpha-beta ring all-reduce, its fit, the predictor."""

from __future__ import annotations

import pytest

from gpufleet.bench.scaling import (
    INTERCONNECTS,
    PREDICT_AT,
    Model,
    Point,
    analyze,
    efficiencies,
    fit_alpha_beta,
    ring_allreduce_seconds,
)


def test_ring_allreduce_time_is_alpha_beta() -> None:
    # 2(p-1) latency steps plus 2(p-1)/p of the buffer over the bus bandwidth.
    assert ring_allreduce_seconds(1, 1e9, 10.0, 1e-5) == 0.0
    assert ring_allreduce_seconds(2, 1e9, 10.0, 1e-5) == pytest.approx(2e-5 + 0.1)
    assert ring_allreduce_seconds(8, 8e9, 10.0, 0.0) == pytest.approx(2 * 7 / 8 * 0.8)


@pytest.mark.parametrize("p", [2, 4, 16])
def test_the_fit_recovers_the_link(p: int) -> None:
    sizes = [1 << k for k in range(16, 26)]
    seconds = [ring_allreduce_seconds(p, s, 12.5, 7e-6) for s in sizes]
    bandwidth, alpha = fit_alpha_beta(p, sizes, seconds)
    assert bandwidth == pytest.approx(12.5) and alpha == pytest.approx(7e-6)


def test_a_fit_without_a_size_trend_falls_back_to_the_best_rate() -> None:
    bandwidth, alpha = fit_alpha_beta(2, [1000, 2000], [2e-6, 1e-6])  # noise: faster when bigger
    # 2(p-1)/p = 1 at p = 2: 2000 bytes in 1 us is 2 GB/s
    assert bandwidth == pytest.approx(2.0) and alpha == pytest.approx(0.5e-6)


def test_efficiency_falls_with_exposed_communication_only() -> None:
    free = Model(1.0, 0.0, 10**9, hidden=1.0, bandwidth_gbps=1.0, alpha=1e-3)
    assert free.efficiency(64, "weak") == pytest.approx(1.0)
    assert free.efficiency(64, "strong") == pytest.approx(1.0)
    costly = Model(1.0, 0.0, 10**9, hidden=0.0, bandwidth_gbps=10.0, alpha=0.0)
    effs = [costly.efficiency(p, "weak") for p in (2, 4, 8, 64)]
    assert effs == sorted(effs, reverse=True) and effs[0] == pytest.approx(1 / 1.1)
    assert costly.efficiency(4, "strong") < costly.efficiency(4, "weak")


def point(mode: str, world: int, model: Model) -> Point:
    step = model.step(world, mode)
    batch = 64 if mode == "strong" else 64 * world
    comm = step - (model.compute1 + model.data1) * (1 / world if mode == "strong" else 1)
    compute = model.compute1 / world if mode == "strong" else model.compute1
    return Point(
        mode,
        world,
        batch,
        step,
        compute,
        model.data1 / (world if mode == "strong" else 1),
        comm,
        batch / step,
        model.gradient_bytes,
    )


def test_analysis_of_points_the_model_made_has_no_error() -> None:
    truth = Model(0.05, 0.005, 40_000_000, hidden=0.0, bandwidth_gbps=5.0, alpha=2e-4)
    points = [point(m, w, truth) for m in ("strong", "weak") for w in (1, 2, 4)]
    allreduce = {"ranks": 4, "bytes": [1 << k for k in range(16, 24)]}
    allreduce["seconds"] = [ring_allreduce_seconds(4, b, 5.0, 2e-4) for b in allreduce["bytes"]]
    out = analyze(points, allreduce)
    assert out["link"]["bandwidth_gbps"] == pytest.approx(5.0)
    for mode in ("strong", "weak"):
        m = out["modes"][mode]
        assert m["max_abs_error"] == pytest.approx(0.0, abs=1e-9)
        assert set(m["predicted"]) == {"here", *INTERCONNECTS}
        assert [int(p) for p in m["predicted"]["nvlink"]] == list(PREDICT_AT)
        # a faster link scales better
        assert m["predicted"]["nvlink"]["64"] > m["predicted"]["25gbe"]["64"]


def test_efficiency_is_throughput_over_n_times_one_worker() -> None:
    pts = [
        Point("weak", 1, 8, 1.0, 1.0, 0.0, 0.0, 100.0, 4),
        Point("weak", 4, 32, 1.0, 1.0, 0.0, 0.0, 300.0, 4),
    ]
    efficiencies(pts)
    assert [p.efficiency for p in pts] == [1.0, 0.75]
