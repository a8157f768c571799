"""An MPIJob worker's PID 1 (gpufleet.launch.mpi_worker): the kubelet's SIGTERM reaches the pod
launcher that mpirun started over SSH, in another session, which sshd alone never passed on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.procs import poll_until

# Stands in for the pod launcher sshd's session runs: "gpufleet.launch.pod" in its command line,
# a SIGTERM handler that records the signal (the preemption checkpoint) and exits 75.
LAUNCHER = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
def term(*_):
    out.write_text("checkpointed")
    sys.exit(75)
signal.signal(signal.SIGTERM, term)
out.with_suffix(".ready").write_text("")
while True:
    time.sleep(0.1)
"""


def test_sigterm_reaches_a_launcher_in_another_session_then_sshd_stops(tmp_path: Path) -> None:
    marker = tmp_path / "launcher.txt"
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    # Not a child of the wrapper, and in a session of its own: as under sshd.
    launcher = subprocess.Popen(
        [sys.executable, str(script), str(marker), "gpufleet.launch.pod"], start_new_session=True
    )
    poll_until(lambda: marker.with_suffix(".ready").exists(), what="the stand-in launcher")
    sshd = [sys.executable, "-c", "import time; time.sleep(600)"]  # stands in for sshd -De
    log = tmp_path / "worker.log"
    with log.open("w") as err:
        worker = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.launch.mpi_worker", *sshd], stderr=err
        )
    try:
        poll_until(lambda: worker.poll() is None and _has_child(worker.pid), what="sshd started")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 128 + signal.SIGTERM
        assert launcher.wait(timeout=10) == 75
        assert marker.read_text() == "checkpointed"
        assert "SIGTERM passed to 1 pod launcher(s)" in log.read_text()
        assert not _has_child(worker.pid)
    finally:
        for p in (launcher, worker):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_without_a_signal_it_exits_with_sshds_code() -> None:
    sshd = [sys.executable, "-c", "raise SystemExit(3)"]
    code = subprocess.run(
        [sys.executable, "-m", "gpufleet.launch.mpi_worker", *sshd], check=False, timeout=30
    ).returncode
    assert code == 3


def _has_child(pid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and int(entry.name) != os.getpid():
                return True
    return False
