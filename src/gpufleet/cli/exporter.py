"""``gpufleet exporter``: serve per-GPU metrics for Prometheus."""

from __future__ import annotations

import signal
import socket
from ssl import SSLContext
from typing import Annotated

import typer

from gpufleet.cli.common import (
    TlsCertOption,
    TlsClientCaOption,
    TlsKeyOption,
    fail,
    stop_on_signals,
)
from gpufleet.console import err_console
from gpufleet.errors import FieldError, MetricsPortError, UserInputError
from gpufleet.extras import require
from gpufleet.observe.devices import Device, SimulatedDevice, nvml_devices
from gpufleet.observe.exporter import DEFAULT_DEADLINE, EXPORTER_PORT, GpuCollector, registry_for
from gpufleet.observe.http import check_listen, start_metrics_server, url
from gpufleet.observe.podresources import SOCKET, Attribution, PodLabels, PodResourcesClient
from gpufleet.observe.tls import checked_context, cli_files
from gpufleet.procs import wait_for
from gpufleet.spec.units import parse_duration


def exporter(
    address: Annotated[
        str, typer.Option(help="Listen address; 0.0.0.0 to be scraped from other hosts.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port (0: any free port).")] = EXPORTER_PORT,
    node: Annotated[str | None, typer.Option(help="The node label (default: hostname).")] = None,
    deadline: Annotated[
        str, typer.Option(help="Longest a scrape waits for the devices, e.g. 2s.")
    ] = f"{DEFAULT_DEADLINE:g}s",
    simulate: Annotated[
        int, typer.Option(help="Serve N simulated GPUs instead of NVML (no GPU needed).")
    ] = 0,
    pod_resources: Annotated[
        str | None,
        typer.Option(
            help="The kubelet pod-resources socket: report which pod holds each GPU "
            f"(gpufleet_gpu_allocated). In a pod: {SOCKET}."
        ),
    ] = None,
    pod_labels: Annotated[
        bool,
        typer.Option(
            help="Read job, tenant and queue from the labels of the pods on this node "
            "(Kubernetes API, needs list on pods; in-cluster service account or kubeconfig)."
        ),
    ] = False,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    simulate_failure: Annotated[
        list[str] | None,
        typer.Option(
            help="GPU:XID, with --simulate: on SIGUSR1 that simulated GPU fails as one that "
            "fell off the bus (XID 79 on real hardware): one XID event, then every read fails "
            "(chaos tests; repeatable)."
        ),
    ] = None,
) -> None:
    """Serve /metrics: utilization, memory, temperature, power, clocks, PCIe, NVLink, ECC, XID."""
    wait, failures = _checked(deadline, simulate, simulate_failure or [])
    _require_extra(simulate=bool(simulate), pod_resources=bool(pod_resources))
    try:
        check_listen(address, port)  # before NVML and the kubelet: a typo fails at once
        files = cli_files(tls_cert, tls_key, tls_client_ca)
        tls = checked_context(files) if files else None
    except MetricsPortError as exc:
        fail(UserInputError([FieldError(exc.option, str(exc))]))
    except UserInputError as exc:
        fail(exc)
    reason: str | None = None
    devices: list[Device]
    if simulate:
        devices = _simulated(simulate, failures)
    else:
        devices, reason = nvml_devices()
    node = node or socket.gethostname()
    attribution = None
    if pod_resources:
        labels = _pod_labels(node) if pod_labels else None
        attribution = Attribution(PodResourcesClient(pod_resources), labels)
    elif pod_labels:
        fail(UserInputError([FieldError("--pod-labels", "needs --pod-resources")]))
    collector = GpuCollector(
        devices, node=node, deadline=wait, nvml_reason=reason, attribution=attribution
    )
    _serve(collector, address, port, tls)


def _require_extra(*, simulate: bool, pod_resources: bool) -> None:
    """The exporter extra's packages this run needs: NVML for real GPUs, gRPC for the kubelet's
    pod-resources API (a missing one: exit 2 with its install command)."""
    needed = [] if simulate else ["pynvml"]
    needed += ["grpc", "google.protobuf"] if pod_resources else []
    require("exporter", *needed, what="gpufleet exporter")


def _serve(collector: GpuCollector, address: str, port: int, tls: SSLContext | None) -> None:
    """Serve the collector's metrics until SIGTERM or SIGINT (HTTPS with ``tls``)."""
    try:
        server, _ = start_metrics_server(
            registry_for(collector), address, port, "gpufleet GPU exporter", tls
        )
    except MetricsPortError as exc:
        fail(UserInputError([FieldError(exc.option, str(exc))]))
    where = url(address, server.server_port, tls=tls is not None)
    reason = collector.nvml_reason
    err_console.print(
        f"serving {len(collector.devices)} GPU(s) at {where}" + (f" ({reason})" if reason else "")
    )
    stop = stop_on_signals()
    wait_for(stop)  # SIGUSR1 too may reach the server's thread
    server.shutdown()
    server.server_close()


def _checked(
    deadline: str, simulate: int, failures: list[str]
) -> tuple[float, list[tuple[int, int]]]:
    """The deadline in seconds and --simulate-failure's pairs, or exit 2 naming the option."""
    try:
        wait = parse_duration(deadline)
    except ValueError as exc:
        fail(UserInputError([FieldError("--deadline", str(exc))]))
    if simulate < 0:
        fail(UserInputError([FieldError("--simulate", f"must be 0 or more, got {simulate}")]))
    return wait, _failures(failures, simulate)


def _failures(given: list[str], simulate: int) -> list[tuple[int, int]]:
    """--simulate-failure's (GPU, XID) pairs, or exit 2 naming the option."""
    out = []
    for text in given:
        gpu, sep, xid = text.partition(":")
        if not simulate:
            why = "needs --simulate (real GPUs fail on their own)"
        elif not (sep and gpu.isdigit() and xid.isdigit()):
            why = f"expected GPU:XID (e.g. 0:79), got {text!r}"
        elif int(gpu) >= simulate:
            why = f"GPU {gpu} is not one of the {simulate} simulated"
        else:
            out.append((int(gpu), int(xid)))
            continue
        fail(UserInputError([FieldError("--simulate-failure", why)]))
    return out


def _simulated(count: int, failures: list[tuple[int, int]]) -> list[Device]:
    """``count`` simulated GPUs; SIGUSR1 fails those of ``failures``."""
    devices = [SimulatedDevice(i) for i in range(count)]
    if failures:

        def fail_them(*_: object) -> None:
            for gpu, xid in failures:
                devices[gpu].fail(xid)
                err_console.print(f"simulated GPU {gpu} lost (XID {xid})", markup=False)

        signal.signal(signal.SIGUSR1, fail_them)
    return list(devices)


def _pod_labels(node: str) -> PodLabels:
    """Pod labels from the Kubernetes API (kubeconfig, else the in-cluster service account)."""
    from kubernetes import client

    from gpufleet.cluster.client import Cluster

    try:  # the typed CoreV1Api: a daemon pays its import once (cluster/builtin.py)
        return PodLabels(client.CoreV1Api(Cluster.connect().core.api_client), node)
    except UserInputError as exc:
        fail(exc)
