"""GPUFLEET_FAULTS firing in a real process (gpufleet.runtime.faults): kill and exit end it as a
crash would, a fault of another restart does not fire, a hang holds it for ever and a pause until
a signal it handles comes, and a lost device is a real sticky CUDA error on a GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from gpufleet.runtime import faults

HANDLES_SIGTERM = """
import signal
from gpufleet.runtime import faults
signal.signal(signal.SIGTERM, lambda *_: print("signalled", flush=True))
"""


def child(fault: str) -> subprocess.Popen[str]:
    """A process that handles SIGTERM (it says so, as the preemption guard would), fires the
    faults of ``step`` 7 on rank 0, then says it survived."""
    env = {**os.environ, faults.ENV_FAULTS: fault, "RANK": "0"}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    code = HANDLES_SIGTERM + "faults.maybe_fire('step', 7); print('survived')"
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


@pytest.mark.parametrize(("fault", "code"), [("kill@step=7", -signal.SIGKILL), ("exit@step=7", 1)])
def test_kill_and_exit_faults_end_the_process_as_a_crash_would(fault: str, code: int) -> None:
    proc = child(fault)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code and "survived" not in out
    action = fault.split("@")[0]
    assert f"gpufleet-fault: {action} at step=7 on rank 0" in err


def test_a_fault_of_another_restart_does_not_fire() -> None:
    proc = child("kill@step=7,restart=1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "survived\n"


@pytest.mark.parametrize(("action", "goes_on"), [("hang", False), ("pause", True)])
def test_a_hang_holds_the_process_for_ever_a_pause_until_a_handled_signal(
    action: str, goes_on: bool
) -> None:
    proc = child(f"{action}@step=7")
    try:
        assert proc.stderr is not None and proc.stdout is not None
        assert proc.stderr.readline() == f"gpufleet-fault: {action} at step=7 on rank 0\n"
        assert proc.poll() is None  # alive, making no progress
        proc.send_signal(signal.SIGTERM)  # a preemption; torchelastic stopping the group
        assert proc.stdout.readline() == "signalled\n"  # its handler ran, and then:
        if goes_on:
            assert proc.stdout.readline() == "survived\n" and proc.wait(timeout=60) == 0
        else:
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=60)
    assert "survived" not in out


@pytest.mark.gpu
def test_a_lost_device_on_a_gpu_is_a_real_sticky_cuda_error() -> None:
    """In a process of its own: the error poisons that process's CUDA context for good."""
    code = ("import torch; from gpufleet.runtime.faults import lost_device; "
            "torch.zeros(1, device='cuda'); e = lost_device(); "
            "print(isinstance(e, RuntimeError), 'device-side assert' in str(e))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.stdout == "True True\n", proc.stderr[-2000:]
