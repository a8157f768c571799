"""The GPU exporter: sick devices never fail a scrape, and the output is what Prometheus reads."""

from __future__ import annotations

import ctypes
import http.client
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.observe.devices import (
    HARDWARE_XIDS,
    Reading,
    SimulatedDevice,
    XidCounter,
    nvml_devices,
)
from gpufleet.observe.exporter import METRICS, GpuCollector, reading_fields, registry_for
from gpufleet.observe.http import start_metrics_server, url
from tests.support.procs import poll_until
from tests.support.scrape import scrape, scrape_port, serve, served_port, stop

RELEASE = threading.Event()  # set at the end of the module: lets hung reads return


@pytest.fixture(scope="module", autouse=True)
def _release_hung_reads() -> Iterator[None]:
    yield
    RELEASE.set()


@dataclass
class SickDevice:
    """A simulated GPU whose reads behave as told: ok, raise, hang or nan."""

    index: int
    behaviour: str
    model: str = "Sick GPU"
    reads: int = field(default=0)
    xids: tuple[tuple[int, float], ...] = ()

    def xid_errors(self) -> tuple[tuple[int, float], ...]:
        return self.xids

    @property
    def uuid(self) -> str:
        return f"GPU-sick-{self.index}"

    def read(self) -> Reading:
        self.reads += 1
        if self.behaviour == "raise":
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        if self.behaviour == "hang":
            RELEASE.wait()
        good = SimulatedDevice(self.index).read()
        if self.behaviour == "nan":
            return Reading(float("nan"), good.memory_used_bytes, good.memory_total_bytes)
        return good


DEADLINE = 0.3
# A scrape that waited on a hung read would take until the client's 10 s timeout; one that
# kept its deadline takes DEADLINE plus the host's noise, which on a shared 2-core machine
# running the suite in two workers is not bounded by much less than this.
PROMPT = 5.0


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(["ok", "raise", "hang", "nan"]), min_size=1, max_size=8))
def test_sick_devices_never_fail_the_scrape(behaviours: list[str]) -> None:
    devices = [SickDevice(i, b) for i, b in enumerate(behaviours)]
    url, server = serve(GpuCollector(devices, node="n1", deadline=DEADLINE))  # type: ignore[arg-type]
    try:
        for _ in range(2):  # the second scrape meets reads still hanging from the first
            status, samples, elapsed = scrape(url)
            assert status == 200
            assert elapsed < PROMPT
            up = {labels["gpu"]: value for labels, value in samples["gpufleet_gpu_up"]}
            assert up == {str(d.index): float(d.behaviour == "ok") for d in devices}
            utilized = {
                labels["gpu"] for labels, _ in samples.get("gpufleet_gpu_utilization_ratio", [])
            }
            assert utilized == {str(d.index) for d in devices if d.behaviour == "ok"}
    finally:
        stop(server)
    hung = [d for d in devices if d.behaviour == "hang"]
    assert all(d.reads == 1 for d in hung)  # no second thread piled onto a hung device


def test_labels_units_and_self_metrics() -> None:
    url, server = serve(GpuCollector([SimulatedDevice(0), SimulatedDevice(1)], node="gpu-node-7"))
    try:
        status, samples, _ = scrape(url)
    finally:
        stop(server)
    assert status == 200
    (labels, _), _second = samples["gpufleet_gpu_temperature_celsius"]
    assert labels == {"gpu": "0", "uuid": SimulatedDevice(0).uuid, "model": "Simulated GPU",
                      "node": "gpu-node-7"}  # fmt: skip
    for name in ("gpufleet_gpu_memory_used_bytes", "gpufleet_gpu_power_watts",
                 "gpufleet_gpu_sm_clock_hertz", "gpufleet_gpu_nvlink_transmit_bytes_total",
                 "gpufleet_gpu_ecc_errors_total",
                 "gpufleet_gpu_pcie_receive_bytes_per_second"):  # fmt: skip
        assert len(samples[name]) >= 2, name
    assert {lab["type"] for lab, _ in samples["gpufleet_gpu_ecc_errors_total"]} == {
        "corrected", "uncorrected"}  # fmt: skip
    assert samples["gpufleet_exporter_devices"][0][1] == 2
    assert 0 <= samples["gpufleet_exporter_scrape_duration_seconds"][0][1] < 1
    assert "process_cpu_seconds_total" in samples  # the exporter's own cost
    ratio = [v for _, v in samples["gpufleet_gpu_utilization_ratio"]]
    assert all(0 <= v <= 1 for v in ratio)


class EventNvml:
    """NVML's event API as the XID counter uses it, fed from a queue (no GPU here to raise XIDs;
    tests/integration/test_gpu.py reads the real one)."""

    class NVMLError(Exception):
        pass

    class NVMLError_Timeout(NVMLError):
        pass

    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return f"GPU-{handle}"

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: str, kind: int, events: object) -> None:
        assert kind == self.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait(self, events: object, timeout_ms: int) -> Any:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise self.NVMLError_Timeout() from None


def test_xid_events_are_counted_by_code_and_exported_with_it() -> None:
    """The XID code tells a failing GPU (79: fallen off the bus) from a faulting program (13):
    counted per device and code, exported as the `xid` label (issue 14)."""
    nvml = EventNvml()
    counter = XidCounter(nvml, {0: "a", 1: "b"})
    for handle, code in (("a", 79), ("a", 13), ("a", 79), ("b", 43), ("unknown", 48)):
        nvml.events.put(SimpleNamespace(device=handle, eventData=code))
    deadline = time.monotonic() + 10
    while not counter.counts(1) and time.monotonic() < deadline:  # b's event is after a's
        time.sleep(0.01)
    assert counter.counts(0) == ((13, 1.0), (79, 2.0))
    assert counter.counts(1) == ((43, 1.0),)
    url, server = serve(GpuCollector([SimulatedDevice(0, xids=counter.counts(0))], node="n"))
    try:
        _, samples, _ = scrape(url)
    finally:
        stop(server)
    xids = {lab["xid"]: v for lab, v in samples["gpufleet_gpu_xid_errors_total"]}
    # the hardware codes at 0 until their first event: that event is an increase at once
    assert xids == {**{str(code): 0.0 for code in HARDWARE_XIDS}, "13": 1.0, "79": 2.0}


def test_a_lost_gpu_is_down_and_still_reports_its_xid() -> None:
    """A GPU that fell off the bus (XID 79) answers no reads: it is down, and its XID series is
    there, the one that tells why (the hardware alert reads it); before, a device whose read
    failed lost its XIDs with its values."""
    lost = SickDevice(0, "raise", xids=((79, 1.0),))
    url, server = serve(GpuCollector([lost, SickDevice(1, "ok")], node="n", deadline=DEADLINE))
    try:
        _, samples, _ = scrape(url)
    finally:
        stop(server)
    up = {lab["gpu"]: v for lab, v in samples["gpufleet_gpu_up"]}
    assert up == {"0": 0.0, "1": 1.0}
    xids = [(lab["gpu"], lab["xid"], lab["node"], v)
            for lab, v in samples["gpufleet_gpu_xid_errors_total"] if v]  # fmt: skip
    assert xids == [("0", "79", "n", 1.0)]
    assert all(lab["gpu"] == "1" for lab, _ in samples["gpufleet_gpu_utilization_ratio"])


def gpu_down(port: int, gpu: str) -> dict[str, Any] | None:
    """The exporter's samples once ``gpu`` is down."""
    _, samples = scrape_port(port)
    up = {lab["gpu"]: v for lab, v in samples["gpufleet_gpu_up"]}
    return dict(samples) if up.get(gpu) == 0 else None


def signal_a_thread_not_main(pid: int, sig: int) -> None:
    """Send ``sig`` to one of ``pid``'s threads other than its main one (tgkill): where the
    kernel may deliver a signal sent to the process, and where Python's handler cannot run."""
    others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    assert others, f"process {pid} runs no thread beside its main one"
    assert ctypes.CDLL(None, use_errno=True).tgkill(pid, others[0], sig) == 0


def test_a_simulated_gpu_fails_on_sigusr1_as_a_lost_one_does() -> None:
    """`--simulate-failure 1:79`: GPU 1 is healthy until the exporter gets SIGUSR1, then down
    with one XID 79 (what a chaos test injects on a node); GPU 0 stays up. The signal goes to
    the server's thread, not the main one: CI once saw the kernel deliver it there, and an
    exporter whose main thread slept in an untimed wait never ran the handler."""
    cmd = [sys.executable, "-m", "gpufleet.cli.main", "exporter", "--simulate", "2",
           "--simulate-failure", "1:79", "--port", "0", "--node", "n"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        port = served_port(proc)  # not free_port(): CI once scraped another test's exporter
        _, before = scrape_port(port)
        assert {lab["gpu"]: v for lab, v in before["gpufleet_gpu_up"]} == {"0": 1.0, "1": 1.0}
        assert all(v == 0 for _, v in before["gpufleet_gpu_xid_errors_total"])
        signal_a_thread_not_main(proc.pid, signal.SIGUSR1)
        after = poll_until(lambda: gpu_down(port, "1"), what="GPU 1 down", alive=proc)
        assert {lab["gpu"]: v for lab, v in after["gpufleet_gpu_up"]} == {"0": 1.0, "1": 0.0}
        xids = [(lab["gpu"], lab["xid"], v)
                for lab, v in after["gpufleet_gpu_xid_errors_total"] if v]  # fmt: skip
        assert xids == [("1", "79", 1.0)]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "simulated GPU 1 lost (XID 79)" in err, err


def test_every_reading_field_becomes_a_metric() -> None:
    mapped = set(METRICS) | {"ecc_corrected_errors_total", "ecc_uncorrected_errors_total"}
    assert mapped == set(reading_fields())


def test_without_nvml_it_serves_and_says_why() -> None:
    devices, reason = nvml_devices()
    if devices:
        pytest.skip("this machine has NVML devices")
    assert reason
    url, server = serve(GpuCollector(devices, node="cpu-node", nvml_reason=reason))
    try:
        status, samples, _ = scrape(url)
    finally:
        stop(server)
    assert status == 200
    ((labels, value),) = samples["gpufleet_exporter_info"]
    assert labels["nvml"] == "unavailable" and labels["reason"] == reason and value == 1
    assert samples["gpufleet_exporter_devices"][0][1] == 0
    assert "gpufleet_gpu_up" not in samples


def test_cli_rejects_a_bad_deadline() -> None:
    result = CliRunner().invoke(app, ["exporter", "--deadline", "soon"])
    assert result.exit_code == EXIT_BAD_INPUT and "--deadline" in result.output


def _request(method: str, url: str) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, parts.path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_the_metrics_server_routes_as_node_exporter_does(address: str) -> None:
    """/metrics only (every path served the metrics), / a landing page, 404 elsewhere, HEAD
    answered (it was 405) with GET's length and no body; an IPv6 URL in brackets."""
    if address == "::1" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    registry = registry_for(GpuCollector([SimulatedDevice(0)], node="n"))
    server, _ = start_metrics_server(registry, address, 0, "gpufleet GPU exporter")
    try:
        base = url(address, server.server_port, "")
        assert base.startswith("http://[::1]:" if address == "::1" else "http://127.0.0.1:")
        status, _, body = _request("GET", base + "/metrics")
        assert status == 200 and b"gpufleet_gpu_up" in body
        status, headers, head_body = _request("HEAD", base + "/metrics")
        assert status == 200 and head_body == b"" and int(headers["Content-Length"]) > 0
        status, _, page = _request("GET", base + "/")
        assert status == 200 and b'href="/metrics"' in page
        for path in ("/nope", "/metrics/x", "/favicon.ico"):
            status, _, body = _request("GET", base + path)
            assert status == 404 and b"gpufleet_gpu_up" not in body, path
        assert _request("POST", base + "/metrics")[0] == 405
    finally:
        stop(server)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "option", "want"),
    [
        (["--port", "99999"], "--port", "must be 0..65535"),
        (["--port", "-1"], "--port", "must be 0..65535"),
        (["--address", "999.1.1.1"], "--address", "not an IP address or host name"),
        (["--address", "no such host"], "--address", "not an IP address or host name"),
        (["--simulate", "-3"], "--simulate", "must be 0 or more"),
        (["--port", "BUSY"], "--port", "Address already in use"),
        (["--simulate-failure", "1:79"], "--simulate-failure", "GPU 1 is not one of the 1"),
        (["--simulate-failure", "0"], "--simulate-failure", "expected GPU:XID"),
        (
            ["--simulate", "0", "--simulate-failure", "0:79"],
            "--simulate-failure",
            "needs --simulate",
        ),
    ],
)
def test_exporter_option_errors_are_one_line_exit_2(
    args: list[str], option: str, want: str, busy_port: int
) -> None:
    """Each gave "internal error: OSError ... please report it" (exit 1), or was accepted."""
    args = [str(busy_port) if a == "BUSY" else a for a in args]
    cmd = [sys.executable, "-m", "gpufleet.cli.main", "exporter", "--simulate", "1", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert f"{option}: " in proc.stderr and want in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_the_cli_and_exporter_do_not_import_torch() -> None:
    """torch costs ~250 MB of RSS; the exporter (and render/status) must not pay it."""
    code = "import sys, gpufleet.cli.main, gpufleet.observe.exporter; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make tools)")
@pytest.mark.parametrize("devices", [0, 1, 8])
def test_promtool_accepts_the_exposition(devices: int) -> None:
    from prometheus_client import generate_latest

    collector = GpuCollector(
        [SimulatedDevice(i) for i in range(devices)],
        node="n1",
        nvml_reason=None if devices else "x",
    )
    text = generate_latest(registry_for(collector))
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
