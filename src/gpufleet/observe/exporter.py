"""``gpufleet exporter``: per-GPU metrics for Prometheus that survive sick devices.

Each scrape reads every device in its own daemon thread and waits at most ``deadline`` seconds
in total. A device that raises, returns NaN/inf or does not answer in time gets
``gpufleet_gpu_up 0`` and no values but its XID counts (kept apart from reads: a GPU that fell
off the bus answers none); the others are reported as usual, and the scrape answers 200 within
the deadline. A read that hangs keeps its thread; later scrapes do not pile more
threads onto that device until it returns, and report it down meanwhile. Without NVML the
exporter still serves: no devices, ``gpufleet_exporter_info{nvml="unavailable",reason=...}``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import fields
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.observe.devices import HARDWARE_XIDS, Device, Reading
from gpufleet.observe.podresources import Allocation, Attribution, Owner

LABELS = ["gpu", "uuid", "model", "node"]
# Who holds a GPU. namespace/pod/container are the names kube-prometheus uses for target labels,
# so the ServiceMonitor scrapes with honorLabels (as for dcgm-exporter) to keep these.
ALLOCATION_LABELS = [
    *LABELS,
    "namespace",
    "pod",
    "container",
    "job_name",
    "tenant",
    "queue",
    "resource",
]
# Reading field -> (metric name, help, kind); counters without _total (the client adds it).
METRICS: dict[str, tuple[str, str, str]] = {
    "utilization_ratio": ("gpufleet_gpu_utilization_ratio", "GPU busy time ratio (0-1).", "gauge"),
    "memory_used_bytes": ("gpufleet_gpu_memory_used_bytes", "Frame buffer memory in use.", "gauge"),
    "memory_total_bytes": ("gpufleet_gpu_memory_total_bytes", "Frame buffer memory.", "gauge"),
    "temperature_celsius": ("gpufleet_gpu_temperature_celsius", "GPU die temperature.", "gauge"),
    "power_watts": ("gpufleet_gpu_power_watts", "Power draw.", "gauge"),
    "sm_clock_hertz": ("gpufleet_gpu_sm_clock_hertz", "SM clock.", "gauge"),
    "pcie_tx_bytes_per_second": (
        "gpufleet_gpu_pcie_transmit_bytes_per_second", "PCIe transmit throughput.", "gauge"),
    "pcie_rx_bytes_per_second": (
        "gpufleet_gpu_pcie_receive_bytes_per_second", "PCIe receive throughput.", "gauge"),
    "nvlink_tx_bytes_total": ("gpufleet_gpu_nvlink_transmit_bytes", "NVLink data sent.", "counter"),
    "nvlink_rx_bytes_total": ("gpufleet_gpu_nvlink_receive_bytes", "NVLink data in.", "counter"),
}  # fmt: skip


# The exporter's port unless told (the chart's monitoring.exporter.port, dcgm-exporter's too).
EXPORTER_PORT = 9400
# Seconds a scrape waits for the devices (and the kubelet) before it answers without them.
DEFAULT_DEADLINE = 2.0


class _Reader:
    """Runs one read in a daemon thread; at most one read in flight per source."""

    def __init__(self, read: Callable[[], Any], name: str) -> None:
        self.read = read
        self.name = name
        self._inflight: Future[Any] | None = None
        self._lock = threading.Lock()

    def start(self) -> Future[Any] | None:
        """A future for a fresh reading, or None while an earlier read still hangs."""
        with self._lock:
            if self._inflight is not None and not self._inflight.done():
                return None
            future: Future[Any] = Future()
            self._inflight = future

        def run() -> None:
            try:
                future.set_result(self.read())
            except BaseException as exc:  # any failure means "source down"
                future.set_exception(exc)

        threading.Thread(target=run, name=f"gpufleet-{self.name}", daemon=True).start()
        return future


class GpuCollector(Collector):
    """A prometheus_client collector over ``devices``; see the module docstring."""

    def __init__(
        self,
        devices: list[Device],
        *,
        node: str | None = None,
        deadline: float = DEFAULT_DEADLINE,
        nvml_reason: str | None = None,
        attribution: Attribution | None = None,
    ) -> None:
        self.devices = devices
        # Device IDs the kubelet may report for a GPU: its UUID, or its index (index strategy).
        self._by_id = {str(d.index): d for d in devices} | {d.uuid: d for d in devices}
        self.readers = [_Reader(d.read, f"gpu{d.index}") for d in devices]
        self.attribution = (
            _Reader(attribution.read, "pod-resources") if attribution is not None else None
        )
        self.node = node or socket.gethostname()
        self.deadline = deadline
        self.nvml_reason = nvml_reason

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        until = started + self.deadline
        pending = [(d, r.start()) for d, r in zip(self.devices, self.readers, strict=True)]
        allocations = self.attribution.start() if self.attribution else None
        up = GaugeMetricFamily(
            "gpufleet_gpu_up", "1 if the last read of this GPU succeeded.", labels=LABELS
        )
        families: dict[str, Any] = {}
        ecc = CounterMetricFamily(
            "gpufleet_gpu_ecc_errors", "Volatile ECC errors.", labels=[*LABELS, "type"]
        )
        # The XID code as a label, as dcgm-exporter does: the rules tell hardware from programs.
        xid = CounterMetricFamily(
            "gpufleet_gpu_xid_errors",
            "XID critical errors since the exporter started, by XID code.",
            labels=[*LABELS, "xid"],
        )
        for device, future in pending:
            labels = [str(device.index), device.uuid, device.model, self.node]
            for code, count in _xids(device):  # also, above all, for a lost GPU
                xid.add_metric([*labels, str(code)], count)
            reading = self._wait(future, until)
            if reading is None:
                up.add_metric(labels, 0)
                continue
            up.add_metric(labels, 1)
            for name, (metric, doc, kind) in METRICS.items():
                value = getattr(reading, name)
                if value is None:
                    continue
                if metric not in families:
                    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                    families[metric] = cls(metric, doc, labels=LABELS)
                families[metric].add_metric(labels, value)
            for kind, value in (("corrected", reading.ecc_corrected_errors_total),
                                ("uncorrected", reading.ecc_uncorrected_errors_total)):  # fmt: skip
                if value is not None:
                    ecc.add_metric([*labels, kind], value)
        yield up
        yield from families.values()
        if ecc.samples:
            yield ecc
        if xid.samples:
            yield xid
        if self.attribution is not None:
            yield from self._allocations(allocations, until)
        yield from self._about_itself(started)

    def _about_itself(self, started: float) -> Iterator[Metric]:
        """The exporter's own state: NVML, how many GPUs it reads, how long this scrape took."""
        info = GaugeMetricFamily(
            "gpufleet_exporter_info",
            "The exporter's NVML state.",
            labels=["nvml", "reason", "node"],
        )
        nvml = "unavailable" if self.nvml_reason else "available"
        info.add_metric([nvml, self.nvml_reason or "", self.node], 1)
        yield info
        yield GaugeMetricFamily(
            "gpufleet_exporter_devices", "GPUs this exporter reads.", value=len(self.readers)
        )
        yield GaugeMetricFamily(
            "gpufleet_exporter_scrape_duration_seconds",
            "Time this scrape spent reading devices.",
            value=time.perf_counter() - started,
        )

    def _allocations(self, future: Future[Any] | None, until: float) -> Iterator[Metric]:
        """gpufleet_gpu_allocated: which container holds which GPU (kubelet pod-resources)."""
        result: tuple[list[tuple[Allocation, Owner]], str | None] = ([], "pod-resources: no answer")
        if future is not None:
            try:
                result = future.result(timeout=max(0.0, until - time.perf_counter()))
            except FutureTimeout:
                result = ([], "pod-resources: no answer within the scrape deadline")
            except Exception as exc:  # Attribution.read returns errors; this is a bug guard
                result = ([], f"pod-resources: {exc}")
        allocations, error = result
        shares: Counter[tuple[str, ...]] = Counter()
        for alloc, owner in allocations:
            device = self._by_id.get(alloc.gpu_id)
            gpu, uuid, model = (
                (str(device.index), device.uuid, device.model) if device else ("", alloc.gpu_id, "")
            )
            shares[(gpu, uuid, model, self.node, alloc.namespace, alloc.pod, alloc.container,
                    owner.job_name, owner.tenant, owner.queue, alloc.resource)] += 1  # fmt: skip
        allocated = GaugeMetricFamily(
            "gpufleet_gpu_allocated",
            "Shares of this GPU the kubelet gave this container (1 unless time-sliced).",
            labels=ALLOCATION_LABELS,
        )
        for labels, count in sorted(shares.items()):
            allocated.add_metric(list(labels), count)
        yield allocated
        yield GaugeMetricFamily(
            "gpufleet_exporter_pod_resources_up",
            "1 if the last kubelet pod-resources List succeeded.",
            value=0 if error else 1,
        )

    @staticmethod
    def _wait(future: Future[Reading] | None, until: float) -> Reading | None:
        if future is None:  # the previous read of this device still hangs
            return None
        try:
            reading = future.result(timeout=max(0.0, until - time.perf_counter()))
        except (FutureTimeout, Exception):
            return None
        if not isinstance(reading, Reading) or reading.invalid():
            return None
        return reading


def _xids(device: Device) -> list[tuple[int, float]]:
    """The device's XID counts by code, the hardware codes at 0 until their first event (as
    Prometheus advises for known label values: a series that appears at its first event reads
    as no increase); none where XIDs are not counted."""
    counted = device.xid_errors()
    if counted is None:
        return []
    return sorted({**dict.fromkeys(HARDWARE_XIDS, 0.0), **dict(counted)}.items())


def registry_for(collector: GpuCollector) -> CollectorRegistry:
    """A registry with the GPU collector and the exporter's own process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


def reading_fields() -> list[str]:
    """Every Reading field (the exporter maps each to a metric; a test keeps them in sync)."""
    return [f.name for f in fields(Reading)]
