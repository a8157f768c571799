"""The dashboard at fleet scale (issue 53, item 6): on the local control plane with 50 nodes x 8
GPUs, two tenants and 200 jobs that run until cancelled (admitted, or waiting for quota), the
jobs, queues and fleet pages': server time per page, what one refresh costs the API server
(requests, by kind), and the jobs page's first render in Chromium. The baseline, in the same
run: the same pages reading the API server directly (``ClusterSource``), against the shared
watch cache that `gpufleet dashboard` uses (``ClusterSource.watched``).

Needs the built components (make controlplane), helm (make tools) and Chromium. Writes
benchmarks/results/dashboard_<hardware>_<date>.{json,md}.

    python benchmarks/dashboard.py [--nodes 50] [--jobs 200] [--reps 10]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import environment, median, write_results
from controlplane import annotated, fleet_cluster, fleet_plan, job_doc, wait

from gpufleet.cluster import Cluster
from gpufleet.devcluster.kwok import RUN_FOR_A_DAY

PAGES = ("/jobs", "/queues", "/fleet")


class Counted:
    """Counts the API requests an ApiClient sends, by method and resource path."""

    def __init__(self, api_client: Any) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        real = api_client.call_api

        def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            path = url.split("?")[0].split("/api", 1)[-1]
            watch = "watch=true" in url
            self.seen[f"{method} {'WATCH ' if watch else ''}{_kind(path)}"] += 1
            return real(method, url, *args, **kwargs)

        api_client.call_api = call_api


def _kind(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    if "namespaces" in parts[:-1]:
        i = parts.index("namespaces")
        parts = parts[:i] + parts[i + 2 :]
    return "/".join(parts[-2:] if len(parts) > 2 else parts)


def client(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


def measure(app: Any, counted: Counted, reps: int) -> dict[str, Any]:
    from starlette.testclient import TestClient

    web = TestClient(app, base_url="http://127.0.0.1:8465")
    out: dict[str, Any] = {}
    for page in PAGES:
        first = web.get(page)  # a new store lists here (the cache's first refresh)
        assert first.status_code == 200, first.text[-500:]
        times, requests = [], []
        for _ in range(reps):
            counted.seen.clear()
            start = time.perf_counter()
            assert web.get(page).status_code == 200
            times.append(time.perf_counter() - start)
            requests.append(dict(counted.seen))
        out[page] = {"server_s_median": round(median(times), 4),
                     "server_s_max": round(max(times), 4),
                     "requests_per_refresh": sum(requests[-1].values()),
                     "requests_by_kind": requests[-1]}  # fmt: skip
    return out


def first_render(app: Any, reps: int) -> dict[str, float]:
    """The jobs page in Chromium, served by uvicorn: navigation timing's milliseconds."""
    import uvicorn
    from playwright.sync_api import sync_playwright

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/jobs"
    script = """() => { const t = performance.getEntriesByType("navigation")[0];
        return {ttfb: t.responseStart - t.requestStart, dom: t.domContentLoadedEventEnd,
                load: t.loadEventEnd}; }"""
    samples: dict[str, list[float]] = collections.defaultdict(list)
    try:
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=shutil.which("chromium"),
                                             args=["--no-sandbox"])  # fmt: skip
            page = browser.new_page()
            for _ in range(reps):
                page.goto(url, wait_until="load")
                for key, value in page.evaluate(script).items():
                    samples[key].append(value)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return {f"{k}_ms_median": round(median(v), 1) for k, v in samples.items()}


def run(workdir: Path, nodes: int, jobs: int, reps: int) -> dict[str, Any]:
    from gpufleet.dashboard.app import create_app
    from gpufleet.dashboard.sources import ClusterSource

    cluster, _, api, up_s = fleet_cluster(workdir, nodes)
    try:
        plan = fleet_plan(jobs)
        for t, name, n, g, _ in plan:
            api.cluster(t).submit(annotated(job_doc(name, t, n, g, t), "job", RUN_FOR_A_DAY))
        workloads = lambda: sum(len(api.workloads(t)) for t in ("tenant-a", "tenant-b"))  # noqa: E731
        wait(lambda: workloads() >= len(plan), timeout=600, interval=2)
        time.sleep(20)  # Kueue admits what fits; the rest waits with a reason
        admitted = sum(
            any(c["type"] == "Admitted" and c["status"] == "True"
                for c in (w.get("status") or {}).get("conditions", []))
            for t in ("tenant-a", "tenant-b") for w in api.workloads(t)
        )  # fmt: skip
        direct_client, cached_client = client(cluster.kubeconfig), client(cluster.kubeconfig)
        counts = Counted(direct_client), Counted(cached_client)
        direct = ClusterSource(Cluster.of(direct_client, "default"))
        cached = ClusterSource.watched(Cluster.of(cached_client, "default"))
        result: dict[str, Any] = {"nodes": nodes, "gpus": nodes * 8, "jobs": len(plan),
                                  "admitted": admitted,
                                  "up_to_ready_s": round(up_s, 1)}  # fmt: skip
        result["direct"] = measure(create_app(workdir, direct), counts[0], reps)
        cached_app = create_app(workdir, cached)
        result["cached"] = measure(cached_app, counts[1], reps)
        result["first_render_cached"] = first_render(cached_app, reps)
        return result
    finally:
        cluster.down(quiet=True)


def report(result: dict[str, Any]) -> list[str]:
    lines = [f"# Dashboard at fleet scale: {result['nodes']} nodes x 8 GPUs, {result['jobs']} jobs "
             f"({result['admitted']} admitted, the rest waiting)", "",
             "Same run, same pages: read directly from the API server (baseline) and from the "
             "shared watch cache that `gpufleet dashboard` uses. Server time: in process "
             "(Starlette's TestClient), median of the reps.", "",
             "| page | direct: server s | cache: server s | ratio | direct: requests/refresh "
             "| cache: requests/refresh |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for page in PAGES:
        d, c = result["direct"][page], result["cached"][page]
        ratio = c["server_s_median"] / d["server_s_median"] if d["server_s_median"] else 0
        lines.append(f"| {page} | {d['server_s_median']} | {c['server_s_median']} | "
                     f"{ratio:.2f} | {d['requests_per_refresh']} | "
                     f"{c['requests_per_refresh']} |")  # fmt: skip
    render = result["first_render_cached"]
    lines += ["", "Jobs page in Chromium (cache): time to first byte "
              f"{render['ttfb_ms_median']} ms, DOM ready {render['dom_ms_median']} ms, "
              f"loaded {render['load_ms_median']} ms.", "",
              "Requests of one refresh, by kind:", ""]  # fmt: skip
    for mode in ("direct", "cached"):
        for page in PAGES:
            kinds = ", ".join(f"{k}: {v}" for k, v in
                              sorted(result[mode][page]["requests_by_kind"].items()))  # fmt: skip
            lines.append(f"- {mode} {page}: {kinds or 'none'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if shutil.which("helm") is None or shutil.which("chromium") is None:
        sys.exit("helm and chromium must be on PATH (make tools; PATH=.tools/bin:$PATH)")
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    try:
        result = run(workdir, args.nodes, args.jobs, args.reps)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    env = environment()
    path = write_results("dashboard", report(result), env, result)
    print(path.read_text())


if __name__ == "__main__":
    main()
