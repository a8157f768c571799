"""The hang watchdog ends a stuck process with EXIT_HUNG and every thread's stack."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

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
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=30, check=False
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == EXIT_HUNG
    assert "rank 3 made no step progress" in proc.stderr
    assert "last step 3" in proc.stderr
    assert "stuck_in_here" in proc.stderr  # the stack dump names where it hung
    assert elapsed < 20


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
