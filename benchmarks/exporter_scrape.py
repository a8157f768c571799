"""Exporter cost per scrape: latency, CPU time and resident memory, 1 and 8 simulated GPUs.

Starts ``gpufleet exporter --simulate N`` as a real process for N in (0, 1, 8), and once more
for 8 GPUs with ``--pod-resources`` against a stand-in kubelet (a gRPC server on a unix socket,
tests/support/kubelet.py, answering 4 pods), so the GPU -> pod attribution's cost shows. Scrapes
each ``--scrapes`` times round-robin (so machine noise hits all alike), and reads the exporter's CPU
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
from pathlib import Path
from typing import Any

import psutil
from common import environment, median, result_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/
from tests.support.kubelet import Kubelet, compiled_upstream, kubelet_answer

# (name, simulated GPUs, with the kubelet's pod-resources)
CONFIGS = [("0", 0, False), ("1", 1, False), ("8", 8, False), ("8+pods", 8, True)]
INTERVAL = 15.0  # seconds between scrapes, a common Prometheus setting


def start(n: int, socket: str | None) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.cli.main",
        "exporter",
        "--port",
        "0",
        "--simulate",
        str(n),
        *(["--pod-resources", socket] if socket else []),
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
    with compiled_upstream() as upstream:
        kubelet = Kubelet(upstream, kubelet_answer(upstream[0]))
        try:
            data = measure(args.scrapes, kubelet.socket)
        finally:
            kubelet.close()
    report(data, args.scrapes)


def measure(scrapes: int, socket: str) -> dict[str, Any]:
    names = [name for name, _, _ in CONFIGS]
    procs = {name: start(n, socket if pods else None) for name, n, pods in CONFIGS}
    try:
        for _, url in procs.values():  # warm up (imports, first collect)
            for _ in range(5):
                scrape(url)
        ps = {n: psutil.Process(p.pid) for n, (p, _) in procs.items()}
        cpu0 = {n: sum(ps[n].cpu_times()[:2]) for n in names}
        latency: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(scrapes):
            for n in names:
                latency[n].append(scrape(procs[n][1]))
        cpu = {n: (sum(ps[n].cpu_times()[:2]) - cpu0[n]) / scrapes for n in names}
        rss = {n: ps[n].memory_info().rss / 2**20 for n in names}
    finally:
        for p, _ in procs.values():
            p.terminate()
            p.wait(10)
    return {
        "config": {"scrapes": scrapes, "configs": names, "interval_s": INTERVAL},
        "environment": environment(),
        "results": {
            str(n): {
                "latency_median_ms": 1000 * median(latency[n]),
                "latency_p99_ms": 1000 * sorted(latency[n])[int(0.99 * len(latency[n])) - 1],
                "cpu_ms_per_scrape": 1000 * cpu[n],
                "core_share_at_15s": cpu[n] / INTERVAL,
                "rss_mb": rss[n],
                "latency_ratio_vs_0": median(latency[n]) / median(latency["0"]),
                "cpu_ratio_vs_0": cpu[n] / cpu["0"] if cpu["0"] else float("nan"),
            }
            for n in names
        },
    }


def report(data: dict[str, Any], scrapes: int) -> None:
    names = data["config"]["configs"]
    path = result_path("exporter-scrape")
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    rows = "\n".join(
        f"| {n} | {r['latency_median_ms']:.2f} | {r['latency_p99_ms']:.2f} | "
        f"{r['cpu_ms_per_scrape']:.2f} | {100 * r['core_share_at_15s']:.3f} % | "
        f"{r['rss_mb']:.1f} | "
        f"{r['latency_ratio_vs_0']:.2f} | {r['cpu_ratio_vs_0']:.2f} |"
        for n, r in ((n, data["results"][n]) for n in names)
    )
    env = "\n".join(f"- {k}: {v}" for k, v in data["environment"].items())
    path.write_text(
        f"# Exporter cost per scrape\n\n`python benchmarks/exporter_scrape.py --scrapes "
        f"{scrapes}`: one exporter process per device count, scraped round-robin over HTTP; "
        "CPU and RSS of the exporter process from psutil. Simulated devices (no GPU here); on a "
        "GPU node NVML calls add their own time. `8+pods`: 8 GPUs plus the kubelet pod-resources "
        "List on every scrape (stand-in kubelet, 4 pods).\n\n"
        "| GPUs | median ms | p99 ms | CPU ms/scrape | core share at 15 s | RSS MB | "
        "latency / 0 GPUs | CPU / 0 GPUs |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        f"{rows}\n\nGoals: < 50 ms per scrape, < 1 % of a core at 15 s, < 80 MB RSS.\n\n"
        f"## Environment\n\n{env}\n"
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
