"""The hang watchdog ends a stuck process with EXIT_HUNG and every thread's stack."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from gpufleet.errors import EXIT_HUNG

STUCK = textwrap.dedent(
    """
    import time
    from gpufleet.runtime.watchdog import HangWatchdog
    dog = HangWatchdog(1.0, rank=3).start()
    for step in range(1, 4):
        time.sleep(0.2)
        dog.beat(step)
    def stuck_in_here():
        time.sleep(60)
    stuck_in_here()
    """
)


def test_watchdog_fires_within_timeout() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == EXIT_HUNG
    assert "last step 3" in proc.stderr
    assert "stuck_in_here" in proc.stderr  # the stack dump names where it hung
    # The watchdog reports how long the rank was idle when it fired, measured on its own clock
    # from the last beat (interpreter start-up does not count). It must not fire before the
    # timeout, and must fire within one poll (0.05 s at a 1 s timeout) plus scheduling slack:
    # one that polled once per timeout would report up to 2 s, one that ignored beats 1.6 s.
    found = re.search(r"rank 3 made no step progress for ([0-9.]+)s", proc.stderr)
    assert found, proc.stderr
    idle = float(found.group(1))
    assert 1.0 <= idle <= 1.5, f"fired after {idle} s idle for a 1 s timeout"


def test_watchdog_quiet_while_beating() -> None:
    code = (
        "import time\n"
        "from gpufleet.runtime.watchdog import HangWatchdog\n"
        "dog = HangWatchdog(0.5).start()\n"
        "for s in range(20):\n"
        "    time.sleep(0.1); dog.beat(s)\n"
        "dog.stop()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
