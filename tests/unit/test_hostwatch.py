"""The rendezvous host watch (gpufleet.launch.hostwatch) against a real listening socket: quiet
while the host accepts or before the group formed, and one report once the host stayed
unreachable long enough, with why; a host that comes back within that time is not lost."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpufleet.launch.hostwatch import HostWatch, split_endpoint

EVERY, LOST_AFTER = 0.05, 0.3


@pytest.fixture
def host() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    stop = threading.Event()

    def accept() -> None:  # the store's side: accept, and the client closes
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join()
    server.close()


def watch(server: socket.socket, formed: bool = True) -> tuple[HostWatch, list[str]]:
    reports: list[str] = []
    port = server.getsockname()[1]
    return HostWatch(f"127.0.0.1:{port}", lambda: formed, reports.append, EVERY, LOST_AFTER), (
        reports
    )


def test_a_reachable_host_is_never_reported(host: socket.socket) -> None:
    hw, reports = watch(host)
    with hw:
        time.sleep(LOST_AFTER * 3)
    assert reports == []


def test_a_host_gone_silent_is_reported_once_with_why(host: socket.socket) -> None:
    hw, reports = watch(host)
    with hw:
        time.sleep(EVERY * 3)
        host.close()  # refused from now on
        deadline = time.monotonic() + 10
        while not reports and time.monotonic() < deadline:
            time.sleep(EVERY)
        time.sleep(LOST_AFTER)  # no second report
    assert len(reports) == 1, reports
    assert reports[0].startswith("unreachable for ") and "refused" in reports[0].lower(), reports


def test_nothing_is_probed_before_the_group_formed(host: socket.socket) -> None:
    hw, reports = watch(host, formed=False)
    host.close()
    with hw:
        time.sleep(LOST_AFTER * 3)
    assert reports == []


def test_an_unresolvable_host_counts_as_unreachable() -> None:
    reports: list[str] = []
    name = "gpufleet-no-such-pod-0.invalid:29400"  # .invalid never resolves (RFC 6761)
    with HostWatch(name, lambda: True, reports.append, EVERY, LOST_AFTER):
        deadline = time.monotonic() + 10
        while not reports and time.monotonic() < deadline:
            time.sleep(EVERY)
    assert len(reports) == 1 and reports[0].startswith("unreachable for "), reports


@pytest.mark.parametrize(
    ("endpoint", "parts"),
    [("job-0.job:29400", ("job-0.job", 29400)), ("[::1]:29400", ("::1", 29400))],
)
def test_endpoints_split_into_host_and_port(endpoint: str, parts: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == parts
