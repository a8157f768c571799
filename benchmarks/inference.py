"""Inference benchmark: dynamic batching, the Server scenario's headroom, client overhead, memory.

One run, one Triton (PyTriton) serving the digits CNN twice from one repository: ``digits`` with
dynamic batching (preferred 16/32/64, 500 us queue delay) and ``digits_single`` without (each
request runs alone). Measured with MLPerf LoadGen through tritonclient over gRPC:

1. Offline throughput with dynamic batching / without (goal >= 3x; Triton's docs show ~3.7x
   for a CNN on a GPU).
2. The Server scenario's highest VALID QPS (99th percentile under ``--latency-ms``) as a
   fraction of Offline throughput (goal >= 0.8), found by bisection.
3. gpufleet's client path per query (LoadGen SingleStream through the SUT) / a bare
   tritonclient ``infer`` loop on the same server, model and inputs (goal <= 1.1).
4. tritonserver's resident memory over a loop of hostile requests (the test suite's set).
5. The HTTP guard (gpufleet.serve.guard, which bounds requests before Triton sees them): the
   latency of one infer request through it / straight to Triton's own HTTP listener, over one
   kept-alive connection each, alternating rounds (goal <= 1.25).

Writes benchmarks/results/inference_<hardware>_<date>.md (and .json beside it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from common import environment, result_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/
from gpufleet.net import free_port
from gpufleet.serve.export import export
from gpufleet.serve.loadgen import BenchConfig, Target, run_bench, samples_for
from gpufleet.serve.repository import Batching
from gpufleet.serve.server import ServeConfig, serving
from gpufleet.workloads.digits import DigitsCNN


def repository(root: Path) -> Path:
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(DigitsCNN().eval()), str(root / "digits.pt"))
    repo = root / "repo"
    for name, dynamic in (("digits", True), ("digits_single", False)):
        export(
            str(root / "digits.pt"),
            repo,
            name=name,
            input_dims=(1, 8, 8),
            batching=Batching(max_batch_size=64, dynamic=dynamic),
        )
    return repo


def offline(grpc: str, model: str, seconds: float, out: Path) -> dict[str, Any]:
    r = run_bench(
        BenchConfig(
            url=grpc, model=model, scenario="Offline", duration=seconds, min_queries=256, outdir=out
        )
    )
    return {"valid": r.valid, "samples_per_second": r.samples_per_second, "queries": r.queries}


def server_peak(
    grpc: str, offline_rate: float, latency_ms: float, seconds: float, out: Path, steps: int
) -> dict[str, Any]:
    """Bisection on the scheduled QPS between 10 % and 120 % of the Offline rate."""
    low, high = 0.1 * offline_rate, 1.2 * offline_rate
    best: dict[str, Any] = {"qps": 0.0, "p99_ms": None}
    tried = []
    for i in range(steps):
        qps = (low + high) / 2
        r = run_bench(
            BenchConfig(
                url=grpc,
                model="digits",
                scenario="Server",
                target_qps=qps,
                latency_ms=latency_ms,
                duration=seconds,
                min_queries=700,
                outdir=out / f"server-{i}",
            )
        )
        tried.append({"qps": round(qps, 1), "valid": r.valid, "p99_ms": r.latency_ms.get("p99")})
        if r.valid:
            low = qps
            best = {"qps": r.scheduled_qps or qps, "p99_ms": r.latency_ms.get("p99")}
        else:
            high = qps
    return {**best, "tried": tried}


def overhead(grpc: str, queries: int, rounds: int, out: Path) -> dict[str, Any]:
    """Mean latency per query: LoadGen SingleStream through gpufleet's SUT vs a bare loop."""
    target = Target(grpc, "digits", 1)
    requests = [target.request(s) for s in samples_for(target, 64, seed=1)]
    bare, sut = [], []
    try:
        for i in range(rounds):  # alternate, so machine noise hits both
            started = time.perf_counter()
            for q in range(queries):
                target.infer(requests[q % len(requests)])
            bare.append((time.perf_counter() - started) / queries)
            r = run_bench(
                BenchConfig(
                    url=grpc,
                    model="digits",
                    scenario="SingleStream",
                    duration=1.0,
                    min_queries=queries,
                    samples=64,
                    outdir=out / f"single-{i}",
                )
            )
            sut.append(r.latency_ms["mean"] / 1000)
    finally:
        target.close()
    return {
        "bare_mean_ms": 1000 * statistics.median(bare),
        "sut_mean_ms": 1000 * statistics.median(sut),
        "ratio": statistics.median(sut) / statistics.median(bare),
    }


def guard_overhead(guard: str, backend: str, queries: int, rounds: int) -> dict[str, Any]:
    """Median seconds per infer request (batch 1, JSON) through the guard and straight to
    Triton, in alternating rounds on one kept-alive connection each."""
    import http.client
    import urllib.parse

    from tests.support.oip import INFER, infer_body

    body = infer_body([1, 1, 8, 8])
    headers = {"Content-Type": "application/json"}

    def per_request(base: str) -> float:
        parts = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            started = time.perf_counter()
            for _ in range(queries):
                conn.request("POST", INFER, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200, resp.status
            return (time.perf_counter() - started) / queries
        finally:
            conn.close()

    through, direct = [], []
    for _ in range(rounds):
        through.append(per_request(guard))
        direct.append(per_request(backend))
    return {
        "guard_ms": 1000 * statistics.median(through),
        "direct_ms": 1000 * statistics.median(direct),
        "ratio": statistics.median(through) / statistics.median(direct),
    }


def hostile_memory(http: str, server: psutil.Process, loops: int) -> dict[str, Any]:
    from tests.support.oip import HOSTILE, INFER, infer_body, post

    bodies = [b for _, path, b, _ in HOSTILE if path == INFER]
    for body in bodies:
        post(http, INFER, body)

    def tree() -> int:
        me = psutil.Process()
        return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])

    before, tree_before = server.memory_info().rss, tree()
    peak = before
    for _ in range(loops):
        for body in bodies:
            post(http, INFER, body)
        peak = max(peak, server.memory_info().rss)
    after, tree_after = server.memory_info().rss, tree()
    good, _ = post(http, INFER, infer_body([1, 1, 8, 8]))
    return {
        "requests": loops * len(bodies),
        "rss_before_mb": before / 2**20,
        "rss_after_mb": after / 2**20,
        "rss_peak_mb": peak / 2**20,
        "tree_before_mb": tree_before / 2**20,
        "tree_after_mb": tree_after / 2**20,
        "good_request_after": good,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline-seconds", type=float, default=10.0)
    parser.add_argument("--server-seconds", type=float, default=3.0)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--bisect-steps", type=int, default=6)
    parser.add_argument("--single-queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hostile-loops", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpufleet-inference-bench-"))
    data: dict[str, Any] = {"config": vars(args), "environment": environment()}
    try:
        repo = repository(root)
        config = ServeConfig(
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=root / "triton.log",
        )
        with serving(repo, config) as endpoints:
            server = next(
                p for p in psutil.Process().children(recursive=True) if p.name() == "tritonserver"
            )
            grpc = endpoints.grpc
            batched = offline(grpc, "digits", args.offline_seconds, root / "offline-batched")
            single = offline(grpc, "digits_single", args.offline_seconds, root / "offline-single")
            peak = server_peak(
                grpc,
                batched["samples_per_second"],
                args.latency_ms,
                args.server_seconds,
                root,
                args.bisect_steps,
            )
            client = overhead(grpc, args.single_queries, args.rounds, root)
            memory = hostile_memory(endpoints.http, server, args.hostile_loops)
            guard = guard_overhead(
                endpoints.http, endpoints.backend_http, args.single_queries, args.rounds
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    data["results"] = {
        "offline_dynamic_batching": batched,
        "offline_no_batching": single,
        "dynamic_batching_speedup": batched["samples_per_second"] / single["samples_per_second"],
        "server_peak": peak,
        "server_fraction_of_offline": peak["qps"] / batched["samples_per_second"],
        "client_overhead": client,
        "hostile_memory": memory,
        "guard_overhead": guard,
    }
    report(data)


def report(data: dict[str, Any]) -> None:
    path = result_path("inference")
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    r = data["results"]
    c, m, p, g = r["client_overhead"], r["hostile_memory"], r["server_peak"], r["guard_overhead"]
    cfg = data["config"]
    tried = ", ".join(f"{t['qps']}{'' if t['valid'] else ' (INVALID)'}" for t in p["tried"])
    env = "\n".join(f"- {k}: {v}" for k, v in data["environment"].items())
    rows = [
        (
            "Offline samples/s, dynamic batching",
            f"{r['offline_dynamic_batching']['samples_per_second']:.0f}",
            "",
        ),
        (
            "Offline samples/s, no batching",
            f"{r['offline_no_batching']['samples_per_second']:.0f}",
            "",
        ),
        ("dynamic batching speed-up", f"{r['dynamic_batching_speedup']:.2f}x", ">= 3x"),
        (
            f"Server: highest VALID QPS, p99 <= {cfg['latency_ms']:.0f} ms",
            f"{p['qps']:.0f} (p99 {p['p99_ms'] or 0:.1f} ms)",
            "",
        ),
        ("Server peak / Offline throughput", f"{r['server_fraction_of_offline']:.2f}", ">= 0.8"),
        ("per query: gpufleet SUT (LoadGen SingleStream)", f"{c['sut_mean_ms']:.2f} ms", ""),
        ("per query: bare tritonclient loop", f"{c['bare_mean_ms']:.2f} ms", ""),
        ("client path overhead ratio", f"{c['ratio']:.3f}", "<= 1.1"),
        ("per HTTP infer request: through the guard", f"{g['guard_ms']:.2f} ms", ""),
        ("per HTTP infer request: straight to Triton", f"{g['direct_ms']:.2f} ms", ""),
        ("HTTP guard overhead ratio", f"{g['ratio']:.3f}", "<= 1.25"),
        (
            f"tritonserver RSS before / peak / after {m['requests']} hostile requests",
            f"{m['rss_before_mb']:.0f} / {m['rss_peak_mb']:.0f} / {m['rss_after_mb']:.0f} MB",
            "bounded",
        ),
        (
            "serving processes (gpufleet, Triton, Python stubs) RSS before / after",
            f"{m['tree_before_mb']:.0f} / {m['tree_after_mb']:.0f} MB",
            "bounded",
        ),
    ]
    table = "| measure | value | goal |\n| --- | --- | --- |\n" + "\n".join(
        f"| {a} | {b} | {g} |" for a, b, g in rows
    )
    path.write_text(f"""# Inference: dynamic batching, Server headroom, client overhead, memory

`python benchmarks/inference.py` (defaults: {json.dumps(cfg)}). One Triton (PyTriton 0.7,
Triton 2.51, Python backend running the TorchScript digits CNN on the CPU) serving the model
with and without dynamic batching; MLPerf LoadGen through tritonclient over gRPC, at most 64
requests in flight. Everything ran on the same 2 cores: LoadGen, the client, Triton and the
model compete for them.

{table}

Server QPS tried (bisection): {tried}.

## Environment

{env}
""")
    print(path.read_text())


if __name__ == "__main__":
    main()
