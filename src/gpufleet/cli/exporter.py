"""``gpufleet exporter``: serve per-GPU metrics for Prometheus."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer
from prometheus_client import start_http_server

from gpufleet.cli.common import err_console, fail
from gpufleet.errors import FieldError, UserInputError
from gpufleet.observe.devices import Device, SimulatedDevice, nvml_devices
from gpufleet.observe.exporter import GpuCollector, registry_for
from gpufleet.spec.units import parse_duration


def exporter(
    address: Annotated[
        str, typer.Option(help="Listen address; 0.0.0.0 to be scraped from other hosts.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port (0: any free port).")] = 9400,
    node: Annotated[str | None, typer.Option(help="The node label (default: hostname).")] = None,
    deadline: Annotated[
        str, typer.Option(help="Longest a scrape waits for the devices, e.g. 2s.")
    ] = "2s",
    simulate: Annotated[
        int, typer.Option(help="Serve N simulated GPUs instead of NVML (no GPU needed).")
    ] = 0,
) -> None:
    """Serve /metrics: utilization, memory, temperature, power, clocks, PCIe, NVLink, ECC, XID."""
    try:
        wait = parse_duration(deadline)
    except ValueError as exc:
        fail(UserInputError([FieldError("--deadline", str(exc))]))
    reason: str | None = None
    devices: list[Device]
    if simulate:
        devices = [SimulatedDevice(i) for i in range(simulate)]
    else:
        devices, reason = nvml_devices()
    collector = GpuCollector(devices, node=node, deadline=wait, nvml_reason=reason)
    server, _ = start_http_server(port, addr=address, registry=registry_for(collector))
    where = f"http://{address}:{server.server_port}/metrics"
    err_console.print(
        f"serving {len(devices)} GPU(s) at {where}" + (f" ({reason})" if reason else "")
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    server.server_close()
