"""GPU devices as the exporter sees them: NVML (nvidia-ml-py) on GPU nodes, simulated elsewhere.

A device's ``read()`` returns one ``Reading``; fields a device does not support are None and are
left out of the scrape. Reads may raise, hang or return NaN on a sick GPU; the collector
(``exporter.py``) contains all three, so nothing here needs to.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Protocol

# NVIDIA's XID codes that mean the GPU, its memory or its links are failing (the alert
# GpufleetGpuXidHardware in deploy/prometheus/gpufleet-rules.yaml lists the same): the exporter
# reports each at 0 until its first event, so Prometheus sees that event as an increase at once.
HARDWARE_XIDS = (48, 63, 64, 74, 79, 92, 93, 94, 95)
# The codes that are a program's fault, not the GPU's (the alert GpufleetGpuXidApplication).
APPLICATION_XIDS = (13, 31, 43)


@dataclass(frozen=True)
class Reading:
    """One device's values, in base units (ratios 0..1, bytes, watts, hertz, degrees Celsius)."""

    utilization_ratio: float
    memory_used_bytes: float
    memory_total_bytes: float
    temperature_celsius: float | None = None
    power_watts: float | None = None
    sm_clock_hertz: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_total: float | None = None
    nvlink_rx_bytes_total: float | None = None
    ecc_corrected_errors_total: float | None = None
    ecc_uncorrected_errors_total: float | None = None

    def invalid(self) -> list[str]:
        """Names of fields holding NaN or infinity (a device returning garbage)."""
        return [
            f.name
            for f in fields(self)
            if isinstance(v := getattr(self, f.name), float) and not math.isfinite(v)
        ]


class Device(Protocol):
    """What the collector needs of a GPU."""

    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str: ...

    @property
    def model(self) -> str: ...

    def read(self) -> Reading: ...

    def xid_errors(self) -> tuple[tuple[int, float], ...] | None:
        """(XID code, events since the exporter started), one pair per code seen; None when
        not counted. NVIDIA's code says whether the GPU is failing (48, 79, ...) or a program
        faulted (13, 31, 43). Not a read of the device, and never blocks: a GPU that fell off
        the bus (XID 79) answers no reads, and its XID is what says so."""
        ...


@dataclass
class SimulatedDevice:
    """A plausible GPU for machines without one (``gpufleet exporter --simulate N``, benchmarks,
    tests). Values move with time so successive scrapes differ, like a busy device's."""

    index: int
    model: str = "Simulated GPU"
    # XID events to report, as (code, count); none by default: a healthy GPU.
    xids: tuple[tuple[int, float], ...] = ()
    lost: bool = False  # fallen off the bus: reads fail (fail())

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-0000-0000-{self.index:012d}"

    def fail(self, xid: int) -> None:
        """Fail as a GPU that fell off the bus does: one more event of ``xid`` (79 on real
        hardware), and every read from now on raises as NVML's does for a lost GPU."""
        counts = Counter(dict(self.xids))
        counts[xid] += 1
        self.xids = tuple(sorted((code, float(n)) for code, n in counts.items()))
        self.lost = True

    def read(self) -> Reading:
        if self.lost:
            raise RuntimeError("GPU is lost (simulated: NVML_ERROR_GPU_IS_LOST)")
        t = time.monotonic()
        busy = 0.5 + 0.45 * math.sin(t / 7.0 + self.index)
        return Reading(
            utilization_ratio=busy,
            memory_used_bytes=40e9 * busy,
            memory_total_bytes=80e9,
            temperature_celsius=35 + 40 * busy,
            power_watts=80 + 600 * busy,
            sm_clock_hertz=1.98e9,
            pcie_tx_bytes_per_second=2e9 * busy,
            pcie_rx_bytes_per_second=3e9 * busy,
            nvlink_tx_bytes_total=t * 1e11,
            nvlink_rx_bytes_total=t * 1e11,
            ecc_corrected_errors_total=0.0,
            ecc_uncorrected_errors_total=0.0,
        )

    def xid_errors(self) -> tuple[tuple[int, float], ...] | None:
        return self.xids


class NvmlDevice:
    """One GPU through NVML. Unsupported queries (NVMLError_NotSupported) become None."""

    def __init__(self, nvml: Any, index: int, xids: XidCounter | None) -> None:
        self._nvml = nvml
        self.index = index
        self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid = _text(nvml.nvmlDeviceGetUUID(self._handle))
        self.model = _text(nvml.nvmlDeviceGetName(self._handle))
        self._xids = xids

    def _optional(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(self._handle, *args)
        except self._nvml.NVMLError_NotSupported:
            return None

    def read(self) -> Reading:
        n, h = self._nvml, self._handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        power_mw = self._optional("nvmlDeviceGetPowerUsage")
        sm_mhz = self._optional("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM)
        tx_kb = self._optional("nvmlDeviceGetPcieThroughput", n.NVML_PCIE_UTIL_TX_BYTES)
        rx_kb = self._optional("nvmlDeviceGetPcieThroughput", n.NVML_PCIE_UTIL_RX_BYTES)
        ecc = [
            self._optional("nvmlDeviceGetTotalEccErrors", kind, n.NVML_VOLATILE_ECC)
            for kind in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        ]
        nvlink = self._nvlink_bytes()
        return Reading(
            utilization_ratio=util.gpu / 100.0,
            memory_used_bytes=float(mem.used),
            memory_total_bytes=float(mem.total),
            temperature_celsius=_num(
                self._optional("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU)
            ),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            sm_clock_hertz=None if sm_mhz is None else sm_mhz * 1e6,
            pcie_tx_bytes_per_second=None if tx_kb is None else tx_kb * 1024.0,
            pcie_rx_bytes_per_second=None if rx_kb is None else rx_kb * 1024.0,
            nvlink_tx_bytes_total=nvlink[0],
            nvlink_rx_bytes_total=nvlink[1],
            ecc_corrected_errors_total=_num(ecc[0]),
            ecc_uncorrected_errors_total=_num(ecc[1]),
        )

    def xid_errors(self) -> tuple[tuple[int, float], ...] | None:
        return None if self._xids is None else self._xids.counts(self.index)

    def _nvlink_bytes(self) -> tuple[float | None, float | None]:
        n = self._nvml
        try:
            values = n.nvmlDeviceGetFieldValues(
                self._handle,
                [n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX],
            )
        except n.NVMLError:
            return None, None
        out: list[float | None] = []
        for v in values:  # KiB counters; nvmlReturn != 0 means this GPU has no NVLink
            out.append(None if v.nvmlReturn != 0 else float(v.value.ullVal) * 1024.0)
        return out[0], out[1]


class XidCounter:
    """Counts XID errors per device and XID code from NVML's event stream, in a background
    thread (an event's ``eventData`` is its XID code)."""

    def __init__(self, nvml: Any, handles: dict[int, Any]) -> None:
        self._nvml = nvml
        self._counts: dict[int, Counter[int]] = {index: Counter() for index in handles}
        # Events name their device by handle; map by UUID, looked up once here.
        self._index_by_uuid = {_text(nvml.nvmlDeviceGetUUID(h)): i for i, h in handles.items()}
        self._lock = threading.Lock()
        self._events = nvml.nvmlEventSetCreate()
        for handle in handles.values():
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
        threading.Thread(target=self._run, name="gpufleet-xid", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                event = self._nvml.nvmlEventSetWait(self._events, 5000)
            except self._nvml.NVMLError_Timeout:
                continue
            except self._nvml.NVMLError:
                return
            index = self._index_by_uuid.get(_text(self._nvml.nvmlDeviceGetUUID(event.device)))
            if index is not None:
                with self._lock:
                    self._counts[index][int(event.eventData)] += 1

    def counts(self, index: int) -> tuple[tuple[int, float], ...]:
        """(XID code, events) for each code this device reported, by code."""
        with self._lock:
            return tuple(
                (code, float(n)) for code, n in sorted(self._counts.get(index, {}).items())
            )


def nvml_devices() -> tuple[list[Device], str | None]:
    """This node's GPUs through NVML, or no devices and the reason (no driver, no library)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return [], f"NVML unavailable: {exc}"
    handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)}
    try:
        xids: XidCounter | None = XidCounter(pynvml, handles)
    except pynvml.NVMLError:  # events not supported (e.g. some virtualized GPUs)
        xids = None
    return [NvmlDevice(pynvml, i, xids) for i in range(count)], None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)
