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
