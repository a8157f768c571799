"""The fleet page's utilization beside allocation, and its unhealthy GPUs, from a Prometheus
that scrapes gpufleet's exporter and evaluates gpufleet's rules (deploy/prometheus; the chart's
PrometheusRule): `gpufleet dashboard --prometheus URL`. The serving page's requests and their
latency, from Triton's own counters of each pod that Prometheus scrapes (with its namespace and
pod labels, as the serving pods' scrape annotations give them).

The page reads the rules' recorded series, so that what it shows is what the alerts and the
Grafana dashboards see: utilization per node and per namespace (of the GPUs allocated to it),
the XID events of the last 10 minutes per GPU, and, from the exporter's own series, the GPUs it
cannot read and their uncorrected ECC errors of the last 10 minutes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

QUERIES = {
    "node": "node:gpufleet_gpu_utilization:avg",
    "namespace": "namespace:gpufleet_gpu_utilization:avg",
    "xid": "gpu:gpufleet_gpu_xid_errors:increase10m",
    "down": "gpufleet_gpu_up == 0",
    "ecc": 'increase(gpufleet_gpu_ecc_errors_total{type="uncorrected"}[10m]) > 0',
}
# Triton's counters, per pod, over the last minute: requests that succeeded, and the time that
# requests took, end to end and waiting in Triton's queue (microseconds, summed over its models).
TRAFFIC = {
    "requests": "sum by (namespace, pod) (rate(nv_inference_request_success[1m]))",
    "seconds": "sum by (namespace, pod) (rate(nv_inference_request_duration_us[1m])) / 1e6",
    "queued": "sum by (namespace, pod) (rate(nv_inference_queue_duration_us[1m])) / 1e6",
}
TIMEOUT_S = 5.0


@dataclass
class Unhealthy:
    """One GPU that is not well, and why."""

    node: str
    gpu: str
    uuid: str
    why: str  # "not answering", "XID 79 (1 in 10 min)", "uncorrected ECC (2 in 10 min)"


@dataclass
class Utilization:
    """Busy ratios (0-1) by node and by namespace, and the unhealthy GPUs; ``error`` when
    Prometheus could not be read (the page says so, and shows allocation alone)."""

    nodes: dict[str, float] = field(default_factory=dict)
    namespaces: dict[str, float] = field(default_factory=dict)
    unhealthy: list[Unhealthy] = field(default_factory=list)
    error: str | None = None


def by_product(nodes: list[Any], utilization: Utilization) -> dict[str, float]:
    """Each product's utilization: its nodes' (``NodeGpus``), weighted by their GPUs."""
    busy: dict[str, float] = {}
    gpus: dict[str, int] = {}
    for node in nodes:
        if node.name in utilization.nodes and node.gpus:
            busy[node.product] = (
                busy.get(node.product, 0.0) + utilization.nodes[node.name] * node.gpus
            )
            gpus[node.product] = gpus.get(node.product, 0) + node.gpus
    return {product: busy[product] / gpus[product] for product in busy}


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    address = f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(address, timeout=TIMEOUT_S) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise ValueError(f"{promql}: {body.get('error') or body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _query_all(url: str, queries: dict[str, str]) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Each query's result by name, or what went wrong ("" when nothing did)."""
    try:
        return {name: _query(url, promql) for name, promql in queries.items()}, ""
    except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError
        return {}, f"Prometheus at {url}: {exc}"


def read(url: str) -> Utilization:
    """What Prometheus at ``url`` says now."""
    found, error = _query_all(url, QUERIES)
    if error:
        return Utilization(error=error)

    def by(name: str, label: str) -> dict[str, float]:
        return {s["metric"].get(label, ""): float(s["value"][1]) for s in found[name]}

    sick = []
    for name in ("down", "xid", "ecc"):
        for series in found[name]:
            labels, count = series["metric"], float(series["value"][1])
            why = {"down": "not answering",
                   "xid": f"XID {labels.get('xid')} ({count:.0f} in 10 min)",
                   "ecc": f"uncorrected ECC ({count:.0f} in 10 min)"}[name]  # fmt: skip
            sick.append(Unhealthy(labels.get("node", ""), labels.get("gpu", ""),
                                  labels.get("uuid", ""), why))  # fmt: skip
    sick.sort(key=lambda u: (u.node, u.gpu, u.why))
    return Utilization(by("node", "node"), by("namespace", "namespace"), sick)


@dataclass
class Traffic:
    """A pod's or a service's requests over the last minute: per second, and the seconds they
    took per second, end to end and in Triton's queue."""

    requests: float = 0.0
    seconds: float = 0.0
    queued: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.requests + other.requests, self.seconds + other.seconds,
                       self.queued + other.queued)  # fmt: skip

    @property
    def latency_ms(self) -> float | None:
        """The mean request's time in Triton (None: no request in the last minute)."""
        return self._per_request(self.seconds)

    @property
    def queue_ms(self) -> float | None:
        """The mean request's wait in Triton's queue, its share of ``latency_ms``."""
        return self._per_request(self.queued)

    def _per_request(self, seconds: float) -> float | None:
        return 1000 * seconds / self.requests if self.requests > 0 else None


@dataclass
class PodTraffic:
    """Each serving pod's Traffic by (namespace, pod); ``error`` when Prometheus could not be
    read."""

    pods: dict[tuple[str, str], Traffic] = field(default_factory=dict)
    error: str | None = None


def traffic(url: str) -> PodTraffic:
    """What Prometheus at ``url`` has of the serving pods' last minute."""
    found, error = _query_all(url, TRAFFIC)
    if error:
        return PodTraffic(error=error)
    pods: dict[tuple[str, str], Traffic] = {}
    for name, series in found.items():
        for one in series:
            key = (one["metric"].get("namespace", ""), one["metric"].get("pod", ""))
            setattr(pods.setdefault(key, Traffic()), name, float(one["value"][1]))
    return PodTraffic(pods)
