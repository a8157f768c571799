"""The rendezvous host's reachability, watched from the other pods: a lost node is silent.

Pod 0 hosts the c10d store every agent talks to. When pod 0 ends (an eviction, a preemption,
a crash) its kernel resets the agents' connections and torch raises, and the launcher exits 75.
When its node dies (power, a kernel panic, a cut link) nothing arrives: an agent blocked on the
store waits on a TCP connection whose packets the kernel retransmits for about 15 minutes
(``tcp_retries2``), past every torch timeout (seen on real nodes: the agent stuck in its
store ``get`` minutes after its worker's hang watchdog ended the worker). The pods' sockets
are torch's, and the sysctl that would shorten it is not one Pod Security ``restricted`` allows.

So each other pod's launcher probes the host itself, once the group has formed: a new TCP
connection to the rendezvous endpoint every ``PROBE_EVERY_S``; refused, unresolvable (pod 0's
DNS record goes once it is not ready) or unanswered for ``LOST_AFTER_S`` in a row, the host is
lost: the launcher ends its workers and exits 75 as for a host that ended (gpufleet.launch.pod).
A connection that opens and closes is what the store's own clients do; it costs the store
nothing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

PROBE_EVERY_S = 5.0
# Longer than a store restart takes (none: the store lives as long as pod 0's agent), shorter
# than the node controller's grace period (50 s) plus spec.nodeLossTimeout (30 s by default).
LOST_AFTER_S = 30.0


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a host and a port."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class HostWatch:
    """Probe ``endpoint`` while ``formed()`` is true; call ``on_lost(reason)`` once, from the
    watch's thread, when it stayed unreachable for ``lost_after`` seconds."""

    def __init__(
        self,
        endpoint: str,
        formed: Callable[[], bool],
        on_lost: Callable[[str], None],
        every: float = PROBE_EVERY_S,
        lost_after: float = LOST_AFTER_S,
    ) -> None:
        self.host, self.port = split_endpoint(endpoint)
        self.formed, self.on_lost = formed, on_lost
        self.every, self.lost_after = every, lost_after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufleet-hostwatch", daemon=True)

    def __enter__(self) -> HostWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def probe(self) -> str:
        """ "" when the host accepts a connection, else why not."""
        try:
            socket.create_connection((self.host, self.port), timeout=self.every).close()
        except OSError as exc:
            return " ".join(str(exc).split()) or type(exc).__name__
        return ""

    def _run(self) -> None:
        down_since: float | None = None
        while not self._stop.wait(self.every):
            if not self.formed():
                continue
            why = self.probe()
            if not why:
                down_since = None
                continue
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            if now - down_since >= self.lost_after and not self._stop.is_set():
                self.on_lost(f"unreachable for {now - down_since:.0f} s: {why}")
                return
