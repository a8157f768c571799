"""Hang watchdog: no step progress within the timeout -> dump every thread's stack, exit."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

from gpufleet.errors import EXIT_HUNG


class HangWatchdog:
    """A daemon thread that ends the process when ``beat()`` is not called for ``timeout`` s.

    A rank stuck in a collective or a deadlock cannot report itself, so this thread does: it
    writes every thread's Python stack to stderr (the rank's log) and exits with EXIT_HUNG, so
    the elastic agent restarts the group from the last checkpoint. ``timeout <= 0`` disables it.
    """

    def __init__(self, timeout: float, *, rank: int = 0) -> None:
        self.timeout = timeout
        self.rank = rank
        self._last = time.monotonic()
        self._step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HangWatchdog:
        """Start watching (no-op when disabled)."""
        if self.timeout > 0 and self._thread is None:
            self._last = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="gpufleet-watchdog", daemon=True)
            self._thread.start()
        return self

    def beat(self, step: int) -> None:
        """Record progress (call after each step and around long operations)."""
        self._step = step
        self._last = time.monotonic()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _run(self) -> None:
        poll = min(1.0, max(0.05, self.timeout / 20))
        while not self._stop.wait(poll):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        sys.stderr.write(
            f"gpufleet: rank {self.rank} made no step progress for {idle:.1f}s "
            f"(hangTimeout {self.timeout:g}s, last step {self._step}); stacks follow\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_HUNG)  # not sys.exit: the main thread is the one that is stuck
