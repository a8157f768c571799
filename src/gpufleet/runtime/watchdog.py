"""Hang watchdog: no progress within the timeout -> dump every thread's stack, exit.

Progress is a Trainer step, or for a ``command:`` job with an explicit ``hangTimeout`` any line
the worker writes to stdout/stderr or a call of ``heartbeat()`` (``watch_output``, started by
the worker shim): gpufleet cannot see a script's steps.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpufleet.errors import EXIT_HUNG


class HangWatchdog:
    """A daemon thread that ends the process when ``beat()`` is not called for ``timeout`` s.

    A rank stuck in a collective or a deadlock cannot report itself, so this thread does: it
    writes every thread's Python stack to stderr (the rank's log) and exits with EXIT_HUNG, so
    the elastic agent restarts the group from the last checkpoint. ``timeout <= 0`` disables it.
    """

    def __init__(
        self,
        timeout: float,
        *,
        rank: int = 0,
        what: str = "step progress",
        on_fire: Callable[[int], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.on_fire = on_fire  # told the last step before the exit (the job's metrics)
        self.rank = rank
        self.what = what
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
        self.alive()
        if _output_watchdog is not None and _output_watchdog is not self:
            _output_watchdog.beat(step)  # a Trainer in a script: its steps are progress too

    def alive(self) -> None:
        """Record progress that has no step (an output line, a heartbeat)."""
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
            f"gpufleet: rank {self.rank} made no {self.what} for {idle:.1f}s "
            f"(hangTimeout {self.timeout:g}s, last step {self._step}); stacks follow\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        try:
            if self.on_fire is not None:
                self.on_fire(self._step)
        finally:
            os._exit(EXIT_HUNG)  # not sys.exit: the main thread is the one that is stuck


_output_watchdog: HangWatchdog | None = None


class _Beating:
    """A text stream that counts every write as progress and is otherwise the stream."""

    def __init__(self, stream: Any, watchdog: HangWatchdog) -> None:
        self._stream = stream
        self._watchdog = watchdog

    def write(self, text: str) -> int:
        self._watchdog.alive()
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def watch_output(timeout: float, *, rank: int = 0) -> HangWatchdog:
    """Start this process's output watchdog: it fires when nothing is written to stdout or
    stderr and ``heartbeat()`` is not called for ``timeout`` seconds."""
    global _output_watchdog
    watchdog = HangWatchdog(timeout, rank=rank, what="output or heartbeat")
    _output_watchdog = watchdog
    sys.stdout = _Beating(sys.stdout, watchdog)
    sys.stderr = _Beating(sys.stderr, watchdog)
    return watchdog.start()


def heartbeat() -> None:
    """Tell gpufleet's hang watchdog that this worker is alive, for a script that is silent
    for longer than its ``hangTimeout`` (no-op when no watchdog watches this process)."""
    if _output_watchdog is not None:
        _output_watchdog.alive()
