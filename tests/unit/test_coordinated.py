"""gpufleet bench coordinated's merge of per-node LoadGen results."""

from __future__ import annotations

from typing import Any

from gpufleet.bench.coordinated import merge


def node(i: int, valid: bool = True, **rates: float) -> dict[str, Any]:
    return {
        "node": i,
        "valid": valid,
        "queries": 100 + i,
        "errors": 0,
        "started": 10.0 + i / 10,
        "latency_ms": {"p50": 1.0 + i, "p90": 2.0 + i, "p99": 3.0 + i},
        **rates,
    }


def test_offline_sums_samples_per_second_and_keeps_the_worst_latency() -> None:
    out = merge("Offline", [node(0, samples_per_second=100.0), node(1, samples_per_second=80.0)])
    assert out["aggregate_rate"] == 180.0 and out["per_node_rate"] == [100.0, 80.0]
    assert out["worst_latency_ms"] == {"p50": 2.0, "p90": 3.0, "p99": 4.0}
    assert out["queries"] == 201 and out["valid"] and out["nodes"] == 2
    assert abs(out["start_skew_seconds"] - 0.1) < 1e-9


def test_server_sums_scheduled_qps_and_one_invalid_node_invalidates_all() -> None:
    out = merge("Server", [node(0, scheduled_qps=50.0), node(1, False, scheduled_qps=50.0)])
    assert out["aggregate_rate"] == 100.0 and out["rate_key"] == "scheduled_qps"
    assert not out["valid"]


def test_single_stream_has_no_sum() -> None:
    out = merge("SingleStream", [node(0), node(1)])
    assert out["aggregate_rate"] is None and out["rate_key"] is None
    assert out["worst_latency_ms"]["p90"] == 3.0
