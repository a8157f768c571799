"""What a LoadGen run leaves behind: its summary log read back, result.json, latency.png and
result.prom (Prometheus text format)."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.serve.loadgen.settings import BenchConfig, BenchResult


def parse_summary(path: Path) -> dict[str, str]:
    """``key : value`` lines of LoadGen's summary log."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and value.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def _num(summary: dict[str, str], key: str) -> float | None:
    try:
        return float(summary[key])
    except (KeyError, ValueError):
        return None


def _yes(summary: dict[str, str], key: str) -> bool | None:
    value = summary.get(key, "").lower()
    return {"yes": True, "no": False}.get(value)


def result_of(
    cfg: BenchConfig, summary: dict[str, str], latencies: list[float], errors: list[str]
) -> BenchResult:
    """The run's result: LoadGen's verdict and numbers from its summary, and our client's
    latencies and failed requests (any failure makes the run INVALID)."""
    verdict = summary.get("Result is", "INVALID")
    ns = {
        "min": "Min latency (ns)",
        "mean": "Mean latency (ns)",
        "max": "Max latency (ns)",
        "p50": "50.00 percentile latency (ns)",
        "p90": "90.00 percentile latency (ns)",
        "p95": "95.00 percentile latency (ns)",
        "p99": "99.00 percentile latency (ns)",
        "p99.9": "99.90 percentile latency (ns)",
    }
    latency = {k: v / 1e6 for k, key in ns.items() if (v := _num(summary, key)) is not None}
    return BenchResult(
        scenario=cfg.scenario,
        result=verdict if not errors else "INVALID",
        valid=verdict == "VALID" and not errors,
        model=cfg.model,
        url=cfg.url,
        samples_per_second=_num(summary, "Samples per second"),
        scheduled_qps=_num(summary, "Scheduled samples per second")
        or _num(summary, "QPS w/ loadgen overhead"),
        target_qps=cfg.target_qps,
        latency_bound_ms=cfg.latency_ms if cfg.scenario == "Server" else None,
        latency_ms=latency,
        queries=len(latencies),
        errors=len(errors),
        first_error=errors[0] if errors else None,
        outdir=str(cfg.outdir),
        min_duration_met=_yes(summary, "Min duration satisfied"),
        summary=summary,
    )


def write_outputs(result: BenchResult, latencies: list[float], prometheus: bool = False) -> None:
    """result.json, latency.png and (with ``prometheus``) result.prom in the result's outdir."""
    outdir = Path(result.outdir)
    (outdir / "result.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    plot_latencies(latencies, result, outdir / "latency.png")
    if prometheus:
        write_prometheus(result, outdir / "result.prom")


def plot_latencies(latencies: list[float], result: BenchResult, path: Path) -> None:
    """Latency of every query in issue order, and their distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [1000 * x for x in latencies]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(ms, ".", markersize=2)
    left.set(xlabel="query (completion order)", ylabel="latency (ms)")
    right.hist(ms, bins=60)
    right.set(xlabel="latency (ms)", ylabel="queries")
    if result.latency_bound_ms:
        for ax, line in ((left, left.axhline), (right, right.axvline)):
            line(result.latency_bound_ms, color="red", linestyle="--", label="bound")
            ax.legend()
    rate = result.samples_per_second or result.scheduled_qps
    fig.suptitle(
        f"{result.model} {result.scenario}: {result.result}"
        + (f", {rate:.1f} samples/s" if rate else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_prometheus(result: BenchResult, path: Path) -> None:
    """The result as gauges (Prometheus text format) for a textfile collector."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    labels = {"model": result.model, "scenario": result.scenario}
    names = list(labels)

    def gauge(name: str, doc: str, value: float | None, **extra: str) -> None:
        if value is None:
            return
        g = Gauge(name, doc, [*names, *extra], registry=registry)
        g.labels(**labels, **extra).set(value)

    gauge("gpufleet_loadgen_valid", "1 if LoadGen judged the run VALID.", float(result.valid))
    gauge("gpufleet_loadgen_samples_per_second", "Samples/s (Offline).", result.samples_per_second)
    gauge("gpufleet_loadgen_scheduled_qps", "Scheduled queries/s (Server).", result.scheduled_qps)
    lat = Gauge(
        "gpufleet_loadgen_latency_seconds",
        "Query latency: min, mean, max, pNN.",
        [*names, "stat"],
        registry=registry,
    )
    for stat, value in result.latency_ms.items():
        lat.labels(**labels, stat=stat).set(value / 1000)
    gauge("gpufleet_loadgen_errors", "Failed requests.", float(result.errors))
    write_to_textfile(str(path), registry)
