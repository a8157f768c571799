"""Coordinated LoadGen: N loopback "nodes" at once against one node alone, in the same run.

    python benchmarks/coordinated.py [--rounds 3] [--qps 60] [--duration 10]

Two Triton servers (PyTriton) serve the digits CNN on 127.0.0.1, one per "node". Each round
runs `gpufleet bench coordinated` four ways, in rotating order:
- Server at ``--qps`` per node, with 1 node and then with 2;
- Offline, with 1 node and then with 2.

Ratios:
- **Server**: aggregate scheduled QPS of 2 nodes / (2 x 1 node), counted only when every node
  is VALID (p99 under the bound). The bound this checks: >= 0.9.
- **Offline**: aggregate samples/s of 2 nodes / (2 x 1 node). Here both "nodes" and both Tritons
  share the machine's 2 cores, so Offline (all it can do) cannot add up. It is reported as the
  share a CPU-bound host gives, not as coordination overhead.

Writes benchmarks/results/coordinated_<hardware>_<date>.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from common import environment, environment_section, result_path

from gpufleet.net import free_port
from gpufleet.serve.repository import Batching
from gpufleet.serve.server import ServeConfig, serving
from gpufleet.workloads.digits import DigitsCNN


def repository(root: Path) -> Path:
    """The digits CNN (random weights: speed is what is measured) as a Triton repository."""
    from gpufleet.runtime.checkpoint import Checkpointer
    from gpufleet.serve.export import export

    torch.manual_seed(0)
    Checkpointer(str(root / "run" / "checkpoints"), log=lambda _: None).save(
        1, {"job": {"model": DigitsCNN().state_dict()}}
    )
    export(
        str(root / "run"),
        root / "repo",
        model="digits",
        batching=Batching(max_batch_size=64, preferred_batch_sizes=(16, 32, 64)),
    )
    return root / "repo"


def run(urls: list[str], scenario: str, extra: list[str], wd: Path) -> dict[str, Any]:
    out = wd / f"{scenario}-{len(urls)}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "bench",
            "coordinated",
            "--urls",
            ",".join(urls),
            "--model",
            "digits",
            "--scenario",
            scenario,
            *extra,
            "--outdir",
            str(out),
            "-o",
            "json",
        ],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if not proc.stdout.strip():
        raise SystemExit(f"{scenario} x{len(urls)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--qps", type=float, default=60.0, help="Server: per node")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    timing = ["--duration", str(args.duration)]
    cases = {
        "server-1": (
            "Server",
            1,
            ["--target-qps", str(args.qps), "--latency-ms", str(args.latency_ms), *timing],
        ),
        "server-2": (
            "Server",
            2,
            ["--target-qps", str(args.qps), "--latency-ms", str(args.latency_ms), *timing],
        ),
        "offline-1": ("Offline", 1, timing),
        "offline-2": ("Offline", 2, timing),
    }
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        wd = Path(tmp)
        repo = repository(wd)
        urls = []
        for i in range(2):
            config = ServeConfig(
                http_port=free_port(),
                grpc_port=free_port(),
                metrics_port=free_port(),
                log_file=wd / f"triton-{i}.log",
            )
            urls.append(stack.enter_context(serving(repo, config)).grpc)
        names = list(cases)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                scenario, n, extra = cases[name]
                merged = run(urls[:n], scenario, extra, wd)
                results[name].append(merged["aggregate"])
                agg = merged["aggregate"]
                print(
                    f"round {r + 1} {name}: {agg['aggregate_rate']:.1f} valid={agg['valid']} "
                    f"skew={agg['start_skew_seconds'] * 1e3:.0f} ms",
                    file=sys.stderr,
                )

    def rate(name: str) -> float:
        runs = results[name]
        return statistics.median(a["aggregate_rate"] if a["valid"] else 0.0 for a in runs)

    server_ratio = rate("server-2") / (2 * rate("server-1")) if rate("server-1") else 0.0
    offline_ratio = rate("offline-2") / (2 * rate("offline-1"))
    summary = {
        "server_ratio": server_ratio,
        "offline_ratio": offline_ratio,
        "median_rates": {k: rate(k) for k in cases},
        "all_valid": {k: all(a["valid"] for a in v) for k, v in results.items()},
        "worst_p99_ms": {
            k: max(a["worst_latency_ms"]["p99"] for a in v) for k, v in results.items()
        },
        "max_start_skew_ms": {
            k: 1e3 * max(a["start_skew_seconds"] for a in v) for k, v in results.items()
        },
    }
    env = environment()
    path = result_path("coordinated")
    path.with_suffix(".json").write_text(
        json.dumps(
            {"environment": env, "config": vars(args), "runs": results, "summary": summary},
            indent=2,
        )
        + "\n"
    )
    lines = [
        "# Coordinated LoadGen: 2 loopback nodes vs 1",
        "",
        f"`python benchmarks/coordinated.py --rounds {args.rounds} --qps {args.qps} "
        f"--duration {args.duration}`: two Tritons (PyTriton, digits CNN, dynamic batching) on "
        "127.0.0.1, one per node; `gpufleet bench coordinated` with 1 and 2 nodes, rotating "
        "order; medians over rounds.",
        "",
        "| case | median aggregate rate | all rounds VALID | worst p99 ms | max start skew ms |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {k} | {summary['median_rates'][k]:.1f} | {summary['all_valid'][k]} | "
            f"{summary['worst_p99_ms'][k]:.1f} | {summary['max_start_skew_ms'][k]:.1f} |"
            for k in cases
        ],
        "",
        f"- Server: aggregate QPS of 2 nodes / (2 x 1 node) = **{server_ratio:.3f}** "
        f"(bound 0.9: {'met' if server_ratio >= 0.9 else 'NOT met'}).",
        f"- Offline: {offline_ratio:.3f}. Both nodes and both Tritons share 2 cores here, so "
        "throughput-bound runs split the machine rather than add up.",
        "",
        *environment_section(env),
    ]
    path.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
