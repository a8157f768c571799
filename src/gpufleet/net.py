"""Local networking helpers shared by the launcher, the servers' callers and the tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from below the kernel's ephemeral
    range (free_ports): one the kernel handed out could become the local end of some program's
    connection before its listener starts (a cold `make test` saw a local rendezvous fail to
    listen on such a port)."""
    return free_ports(1)[0]


# Where the kernel picks the ports it hands out itself (a bind to port 0, the local end of an
# outgoing connection), and the lowest port free_ports() uses below that range.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
QUIET_FLOOR = 10000
# The first of those ports are for local control planes alone (gpufleet.devcluster): a control
# plane picks its ports at once and starts its listeners one by one over a minute, and another
# program's free_ports() meanwhile took one of them (Kueue's metrics port, in a `make test`
# whose other worker ran local jobs).
CLUSTER_SPAN = 6000
# The control-plane ports this process handed out: a later call never hands out one again. A
# cluster's parts choose their ports at different moments (the plan at once, then Prometheus,
# CoreDNS) and bind them later still: Prometheus once took the port planned for Volcano's
# scheduler, which then failed to start ("address already in use").
_HANDED_OUT: set[int] = set()


def quiet_ports(*, cluster: bool = False) -> range:
    """Ports the kernel never hands out on its own (from QUIET_FLOOR to below the ephemeral
    range; empty when that range starts lower), in two parts: the first CLUSTER_SPAN for
    control planes (``cluster``), the rest for every other caller."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    split = min(QUIET_FLOOR + CLUSTER_SPAN, low)
    return range(QUIET_FLOOR, split) if cluster else range(split, low)


def free_ports(count: int, *, cluster: bool = False) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago, all bound at once
    while chosen (so no two are the same, as separate free_port() calls may be). Taken at random
    from quiet_ports(): a control plane starts its listeners one by one over a minute, and a
    port the kernel may hand out could meanwhile become the local end of some program's
    connection; from the kernel's own when that range is too small. ``cluster``: for a control
    plane's listeners, from quiet ports no other caller takes, none this process handed out
    before."""
    quiet = quiet_ports(cluster=cluster)
    candidates = random.sample(quiet, len(quiet)) if len(quiet) >= 8 * count else []
    sockets: list[socket.socket] = []
    try:
        for port in [*candidates, *[0] * count]:
            if len(sockets) == count:
                break
            if cluster and port in _HANDED_OUT:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken, or lingering after a connection
                s.close()
                continue
            sockets.append(s)
        chosen = [int(s.getsockname()[1]) for s in sockets]
        if cluster:
            _HANDED_OUT.update(chosen)
        return chosen
    finally:
        for s in sockets:
            s.close()


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` on every interface now (as a Go server given
    ":port" does, with SO_REUSEADDR, so a closed connection's TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True
