"""What ``gpufleet bench coordinated`` reports: the merge of every node's LoadGen result per
scenario (pure), the table and the JSON.

The aggregate, per scenario:
- **Offline**: samples/s summed over the nodes.
- **Server**: scheduled QPS summed.
- **SingleStream**: the nodes' latencies side by side (a sum means nothing there).

Latency percentiles are the worst node's, which is conservative. The aggregate is VALID only
when every node is.
"""

from __future__ import annotations

from typing import Any

from gpufleet.errors import EXIT_FAILED

RATE_KEY = {"Offline": "samples_per_second", "Server": "scheduled_qps"}


def merge(scenario: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The aggregate of per-node LoadGen results (BenchResult.to_json() plus ``node``,
    ``started``)."""
    key = RATE_KEY.get(scenario)
    rates = [n.get(key) or 0.0 for n in nodes] if key else []
    started = [n["started"] for n in nodes]
    percentiles = ("p50", "p90", "p99")
    worst = {p: max(n["latency_ms"].get(p, float("nan")) for n in nodes) for p in percentiles}
    return {
        "scenario": scenario,
        "nodes": len(nodes),
        "valid": all(n["valid"] for n in nodes),
        "rate_key": key,
        "aggregate_rate": sum(rates) if key else None,
        "per_node_rate": rates,
        "worst_latency_ms": worst,
        "queries": sum(n["queries"] for n in nodes),
        "errors": sum(n["errors"] for n in nodes),
        "start_skew_seconds": max(started) - min(started),
    }


def table(merged: dict[str, object]) -> list[str]:
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


def show(merged: dict[str, Any], as_json: bool) -> int:
    """The table or the JSON; the exit code: 1 unless every node was VALID."""
    from gpufleet.bench import runner

    if as_json:
        runner.print_json(merged)
    else:
        print("\n".join(table(merged)))
    return 0 if merged["aggregate"]["valid"] else EXIT_FAILED
