"""Preemption: SIGTERM/SIGINT become a stop that all ranks agree on at a step boundary."""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType

import torch
import torch.distributed as dist


class PreemptionGuard:
    """Catches SIGTERM and SIGINT and tells every rank, at the same step, to checkpoint and stop.

    The agreement is an all-reduce (MAX) of each rank's flag on a small gloo group. It is
    started without waiting at one step boundary and read at the next, so it costs no wait on
    the training path; all ranks read the same reduced value and stop at the same step.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self._group = group
        self._requested = threading.Event()
        self._signal: int | None = None
        self._work: dist.Work | None = None
        self._buf = torch.zeros(1, dtype=torch.int32)
        self._previous: dict[int, object] = {}
        self._stopped = False  # the ranks agreed to stop: the process exits 75 next
        # When this process got its signal (time.time()): the grace period counts from it, and
        # the launcher's wait for the durable upload gets what is left (gpufleet.launch.uploads).
        self.signalled_at: float | None = None

    def install(self) -> PreemptionGuard:
        """Install the signal handlers (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the previous handlers; after an agreed stop, ignore the signals instead.
        A rank whose own node's SIGTERM comes after the agreement (another node's started it:
        a Kueue eviction deletes the pods one by one) would otherwise die of it between here
        and its preemption marker, and its pod exit 143, not 75 (seen on real nodes). The
        process exits 75 right after the marker; a SIGKILL after the grace period still ends
        it."""
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self._stopped else handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._requested.is_set():
            name = signal.Signals(signum).name
            print(f"gpufleet: got {name}; checkpointing at the next step boundary", file=sys.stderr)
        self._signal = signum
        if self.signalled_at is None:
            self.signalled_at = time.time()
        self._requested.set()

    def request(self) -> None:
        """Ask for a stop as a signal would (for tests and embedding code)."""
        self._requested.set()

    @property
    def requested_locally(self) -> bool:
        """True once this process got a signal."""
        return self._requested.is_set()

    def should_stop(self) -> bool:
        """Call once per step boundary on every rank; True on all ranks at the same step."""
        if not (dist.is_available() and dist.is_initialized()):
            self._stopped = self._requested.is_set()
            return self._stopped
        agreed = False
        if self._work is not None:
            self._work.wait()
            agreed = bool(self._buf.item())
        if agreed:
            self._work = None
            self._stopped = True
            return True
        self._buf = torch.tensor([int(self._requested.is_set())], dtype=torch.int32)
        self._work = dist.all_reduce(
            self._buf, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        return False

    def drain(self) -> None:
        """Wait for an all-reduce still in flight (before teardown)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
