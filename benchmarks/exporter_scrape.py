"""Exporter cost per scrape: latency, CPU time and resident memory, 1 and 8 simulated GPUs.

Starts ``gpufleet exporter --simulate N`` as a real process for N in (0, 1, 8), scrapes each
``--scrapes`` times round-robin (so machine noise hits all alike), and reads the exporter's CPU
time and RSS with psutil. N = 0 (the same process serving only its self metrics) is the
baseline in the same run; the ratios and the CPU share at a 15 s scrape interval are reported
against the goals (< 50 ms per scrape, < 1 % of a core, < 80 MB RSS).

Writes benchmarks/results/exporter-scrape_<hardware>_<date>.md (and .json beside it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import psutil
from common import environment, median, result_path

COUNTS = (0, 1, 8)
INTERVAL = 15.0  # seconds between scrapes, a common Prometheus setting


def start(n: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.cli.main",
        "exporter",
        "--port",
        "0",
        "--simulate",
        str(n),
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr
    line = proc.stderr.readline()
    match = re.search(r"(http://\S+/metrics)", line)
    assert match, line
    return proc, match.group(1)


def scrape(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        resp.read()
        assert resp.status == 200
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    procs = {n: start(n) for n in COUNTS}
    try:
        for _, url in procs.values():  # warm up (imports, first collect)
            for _ in range(5):
                scrape(url)
        ps = {n: psutil.Process(p.pid) for n, (p, _) in procs.items()}
        cpu0 = {n: sum(ps[n].cpu_times()[:2]) for n in COUNTS}
        latency: dict[int, list[float]] = {n: [] for n in COUNTS}
        for _ in range(args.scrapes):
            for n in COUNTS:
                latency[n].append(scrape(procs[n][1]))
        cpu = {n: (sum(ps[n].cpu_times()[:2]) - cpu0[n]) / args.scrapes for n in COUNTS}
        rss = {n: ps[n].memory_info().rss / 2**20 for n in COUNTS}
    finally:
        for p, _ in procs.values():
            p.terminate()
            p.wait(10)
    data: dict[str, Any] = {
        "config": {"scrapes": args.scrapes, "counts": list(COUNTS), "interval_s": INTERVAL},
        "environment": environment(),
        "results": {
            str(n): {
                "latency_median_ms": 1000 * median(latency[n]),
                "latency_p99_ms": 1000 * sorted(latency[n])[int(0.99 * len(latency[n])) - 1],
                "cpu_ms_per_scrape": 1000 * cpu[n],
                "core_share_at_15s": cpu[n] / INTERVAL,
                "rss_mb": rss[n],
                "latency_ratio_vs_0": median(latency[n]) / median(latency[0]),
                "cpu_ratio_vs_0": cpu[n] / cpu[0] if cpu[0] else float("nan"),
            }
            for n in COUNTS
        },
    }
    path = result_path("exporter-scrape")
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    rows = "\n".join(
        f"| {n} | {r['latency_median_ms']:.2f} | {r['latency_p99_ms']:.2f} | "
        f"{r['cpu_ms_per_scrape']:.2f} | {100 * r['core_share_at_15s']:.3f} % | "
        f"{r['rss_mb']:.1f} | "
        f"{r['latency_ratio_vs_0']:.2f} | {r['cpu_ratio_vs_0']:.2f} |"
        for n, r in ((n, data["results"][str(n)]) for n in COUNTS)
    )
    env = "\n".join(f"- {k}: {v}" for k, v in data["environment"].items())
    path.write_text(
        f"# Exporter cost per scrape\n\n`python benchmarks/exporter_scrape.py --scrapes "
        f"{args.scrapes}`: one exporter process per device count, scraped round-robin over HTTP; "
        "CPU and RSS of the exporter process from psutil. Simulated devices (no GPU here); on a "
        "GPU node NVML calls add their own time.\n\n"
        "| GPUs | median ms | p99 ms | CPU ms/scrape | core share at 15 s | RSS MB | "
        "latency / 0 GPUs | CPU / 0 GPUs |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        f"{rows}\n\nGoals: < 50 ms per scrape, < 1 % of a core at 15 s, < 80 MB RSS.\n\n"
        f"## Environment\n\n{env}\n"
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
