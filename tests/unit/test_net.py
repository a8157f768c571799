"""Free ports for the servers gpufleet starts (gpufleet.net): a candidate port that is taken is
skipped, not returned, and the operating system's choice fills the gap."""

from __future__ import annotations

import socket

import pytest

from gpufleet import net


def test_a_taken_candidate_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Every candidate is the taken port: each bind fails, the OS's free port is used.
        monkeypatch.setattr(net, "quiet_ports", lambda **_: [port] * 16)
        chosen = net.free_ports(2)
    assert len(chosen) == 2 and port not in chosen and len(set(chosen)) == 2


def test_a_control_plane_port_is_handed_out_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster's parts choose their ports at different moments and bind them later still:
    Prometheus once took the port planned for Volcano's scheduler. 16 quiet ports in 8 calls
    of 2: each handed out once, though each was free again right after its call."""
    monkeypatch.setattr(net, "quiet_ports", lambda **_: range(20000, 20016))
    monkeypatch.setattr(net, "_HANDED_OUT", set())
    chosen = [port for _ in range(8) for port in net.free_ports(2, cluster=True)]
    assert len(set(chosen)) == 16
