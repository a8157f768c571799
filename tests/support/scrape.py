"""Reading /metrics endpoints in tests: the GPU exporter's and the job metrics a launcher serves,
parsed with prometheus_client's own parser."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.observe.exporter import GpuCollector, registry_for
from gpufleet.observe.http import start_metrics_server
from gpufleet.runtime.metrics import JobMetrics

Samples = dict[str, list[tuple[dict[str, str], float]]]  # name -> [(labels, value)]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by sample name."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def scrape(url: str) -> tuple[int, Samples, float]:
    """GET ``url``: the HTTP status, the samples and the seconds the scrape took."""
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as resp:
        status, text = resp.status, resp.read().decode()
    return status, parse(text), time.monotonic() - started


def served_port(proc: subprocess.Popen[Any]) -> int:
    """The port of an exporter started with ``--port 0`` (its stderr a text pipe), read from its
    first line ("serving N GPU(s) at http://127.0.0.1:PORT/metrics"). A port the kernel picked
    at bind time: one picked by the test beforehand (free_port) may be taken meanwhile by
    another test's server, and the test would then scrape that one."""
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r" at https?://[^ ]*:(\d+)/metrics", line)
    assert found, f"the exporter did not say where it serves: {line!r}"
    return int(found.group(1))


def scrape_port(port: int) -> tuple[str, Samples]:
    """The text and samples of http://127.0.0.1:<port>/metrics (OSError while nothing listens)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return text, parse(text)


def steps_by_rank(samples: Samples) -> dict[str, float]:
    """The job metrics' current step of each rank."""
    return {labels["rank"]: value for labels, value in samples.get("gpufleet_job_step", [])}


def serve(collector: GpuCollector) -> tuple[str, object]:
    """Serve ``collector`` as the exporter does, on a free port; returns (url, server)."""
    server, _ = start_metrics_server(registry_for(collector), "127.0.0.1", 0, "exporter")
    return f"http://127.0.0.1:{server.server_port}/metrics", server


def stop(server: object) -> None:
    """Stop a server that ``serve`` started."""
    server.shutdown()  # type: ignore[attr-defined]
    server.server_close()  # type: ignore[attr-defined]


@contextmanager
def stuck_job(hang_timeout: float = 30.0, stuck_for: float = 600) -> Iterator[int]:
    """Job "train"'s metrics served as a launcher serves them, its last step ``stuck_for``
    seconds ago (past its ``hang_timeout``: the no-progress alert's case); yields the port."""
    registry = CollectorRegistry()
    job = JobMetrics("train", 0, registry, hang_timeout=hang_timeout)
    job.last_progress.set(time.time() - stuck_for)
    server, _ = start_metrics_server(registry, "127.0.0.1", 0, "job")
    try:
        yield server.server_port
    finally:
        stop(server)
