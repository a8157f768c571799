"""What tests/conftest.py puts back after every test, in a real pytest run: a test that leaves
SIGTERM ignored (as a Trainer preempted in-process does) does not hand that to the next test,
nor to the processes the next test starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

INNER = """
import signal, subprocess

def test_leaves_sigterm_ignored():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

def test_the_next_one_and_its_processes_take_sigterm():
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    sleeper = subprocess.Popen(["sleep", "30"])
    sleeper.terminate()
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
"""


def test_signal_handlers_are_put_back_after_each_test(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         f"--rootdir={tmp_path}", str(tmp_path / "test_inner.py")],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
