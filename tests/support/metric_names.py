"""The metric names gpufleet really exposes, for tests of rules and dashboards."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.launch.uploads import DurableCollector
from gpufleet.observe.devices import SimulatedDevice
from gpufleet.observe.exporter import GpuCollector
from gpufleet.observe.podresources import Allocation, Attribution
from gpufleet.runtime.durable import UploadState
from gpufleet.runtime.metrics import JobMetrics
from tests.support.paths import REPO

RULES = REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml"
# gpufleet metric names, recording-rule names (level:metric:operations) and Triton's (nv_*) in a
# PromQL string
NAME = re.compile(
    r"\b([a-z_]+:(?:gpufleet|kueue)_[a-z_:0-9]+|gpufleet_[a-z_]+|nv_[a-z_]+|kueue_[a-z_]+)\b"
)


TRITON = REPO / "tests" / "fixtures" / "triton" / "metrics-2.51.txt"


def triton() -> set[str]:
    """Triton's own metric names, as recorded from a live server (test_serving re-checks them)."""
    # Names as Triton writes them (prometheus_client's parser would add _total to counters).
    lines = TRITON.read_text().splitlines()
    return {m.group(1) for line in lines if (m := re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", line))}


KUEUE = REPO / "tests" / "fixtures" / "kueue" / "metrics-0.19.2.txt"


def kueue() -> set[str]:
    """Kueue's sample names at the pinned version (histograms as _bucket, _sum and _count)."""
    names = set()
    for line in KUEUE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()
            names |= (
                {f"{name}_{s}" for s in ("bucket", "sum", "count")}
                if kind == "histogram"
                else {name}
            )
    return names


def recorded() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def _durable_collector() -> DurableCollector:
    """The node uploader's series, from a state file as its launcher writes it."""
    state = Path(tempfile.mkdtemp()) / "durable.json"
    state.write_text(json.dumps(UploadState(newest_fast=20, newest_durable=10).to_json()))
    return DurableCollector(state, "j")


def produced() -> set[str]:
    """Sample names the exporter and the job metrics expose (on a private registry), the series
    the recording rules produce, Triton's and Kueue's."""
    registry = CollectorRegistry()
    held = Allocation("ns", "pod", "c", "nvidia.com/gpu", SimulatedDevice(0).uuid)
    attribution = Attribution(lambda: [held])
    device = SimulatedDevice(0, xids=((79, 1.0),))
    registry.register(GpuCollector([device], node="n", attribution=attribution))
    metrics = JobMetrics("j", 0, registry=registry, hang_timeout=60)
    metrics.record_step(1, 0.1, 0.01, 8)
    metrics.record_checkpoint(1, 0.5, 0.1)
    metrics.loss.set(1.0)
    registry.register(_durable_collector())
    text = generate_latest(registry).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    return names | recorded() | triton() | kueue()
