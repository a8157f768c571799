"""Fault injection for chaos tests, like etcd's failpoints: off unless GPUFLEET_FAULTS is set.

``GPUFLEET_FAULTS="kill@step=7,rank=1;hang@checkpoint_written=10"`` - each entry is
``action@point=N`` with optional ``rank=R`` (default 0) and ``restart=K`` (default 0: only the
first attempt, so the restarted group can get past the point). Actions: ``kill`` (SIGKILL
itself), ``hang`` (stop making progress), ``pause`` (stop until a signal the process handles
comes, its SIGTERM or SIGINT: a preemption, or torchelastic stopping the group to let a node
in; its handler runs and the process goes on), ``exit`` (exit code 1), ``nan`` (fill a weight of
this rank with NaN, as a bad batch or a too-large learning rate would; only where the caller
passes ``poison``), ``slow`` (a measurement reads 100 times slower, as on a host busy while it
measured; where the caller asks ``active``), ``device`` (raise what PyTorch raises when the
rank's GPU is lost: lost_device()). Points: ``step`` (after step N's
optimizer update), ``batch`` (step N's loss, before its backward: ``nan@batch=N`` is a bad
batch, met again whenever step N's batch is trained), ``checkpoint_written`` (step N's
checkpoint data is written, its completion marker is not) and ``calibrate`` (LoadGen's N-th
measurement of the endpoint's rate in this process).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import FrameType
from typing import Any

ENV_FAULTS = "GPUFLEET_FAULTS"
_ACTIONS = ("kill", "hang", "pause", "exit", "nan", "slow", "device")
_POINTS = ("step", "batch", "checkpoint_written", "calibrate")
SLOWDOWN = 100.0  # what ``slow`` divides a measured rate by
# What a CUDA call raises once the device is lost (a GPU that fell off the bus, NVIDIA's XID
# 79): c10's CUDA check raises torch.AcceleratorError carrying the CUDA error code, here
# cudaErrorLaunchFailure, with the message PyTorch prints for it.
LOST_DEVICE_CODE = 719
LOST_DEVICE_MESSAGE = (
    "CUDA error: unspecified launch failure\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


@dataclass(frozen=True)
class Fault:
    """One injected fault."""

    action: str
    point: str
    at: int
    rank: int = 0
    restart: int = 0


def parse_faults(text: str) -> list[Fault]:
    """Parse the GPUFLEET_FAULTS syntax; raises ValueError on anything malformed."""
    faults = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        action, sep, rest = entry.partition("@")
        if not sep or action not in _ACTIONS:
            raise ValueError(f"bad fault {entry!r}: expected one of {_ACTIONS} followed by '@'")
        fields: dict[str, int] = {}
        point = ""
        for i, item in enumerate(rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not value.isdigit():
                raise ValueError(f"bad fault {entry!r}: expected key=number, got {item!r}")
            if i == 0:
                point = key
            fields[key] = int(value)
        if point not in _POINTS:
            raise ValueError(f"bad fault {entry!r}: point must be one of {_POINTS}")
        faults.append(
            Fault(action, point, fields[point], fields.get("rank", 0), fields.get("restart", 0))
        )
    return faults


@cache
def _active() -> tuple[Fault, ...]:
    return tuple(parse_faults(os.environ.get(ENV_FAULTS, "")))


def _here(point: str, at: int) -> list[Fault]:
    """The faults configured for this point and count, on this rank and restart."""
    faults = _active()
    if not faults:
        return []
    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return [f for f in faults if (f.point, f.at, f.rank, f.restart) == (point, at, rank, restart)]


def active(action: str, point: str, at: int) -> bool:
    """Whether fault ``action`` is configured here (for actions the caller carries out)."""
    hit = [f for f in _here(point, at) if f.action == action]
    if hit:
        rank = os.environ.get("RANK", "0")
        print(f"gpufleet-fault: {action} at {point}={at} on rank {rank}", file=sys.stderr)
    return bool(hit)


def lost_device() -> RuntimeError:
    """The exception of a CUDA call on a lost device (``device`` fault). On a GPU, a real sticky
    CUDA error instead: a kernel's device-side assert (an index out of range), which poisons
    the process's CUDA context as a lost device does (every later CUDA call fails; only a new
    process recovers)."""
    import torch

    # Run on a GPU only: tests/unit/test_fault_processes.py::test_a_lost_device_on_a_gpu_is_a_real_*
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if cuda:  # pragma: no cover - GPU only
        try:
            values = torch.zeros(1, device="cuda")
            values[torch.tensor([1], device="cuda")].sum().item()  # asserts on the device
        except RuntimeError as exc:
            return exc
    error = torch.AcceleratorError(LOST_DEVICE_MESSAGE)
    error.error_code = LOST_DEVICE_CODE  # type: ignore[attr-defined]
    return error


def nan_fires(point: str, step: int) -> bool:
    """Whether a ``nan`` fault fires at ``point`` and ``step`` here (the other actions of the
    point fire as maybe_fire's do): ``nan@batch=N`` makes step N's loss NaN."""
    fired: list[bool] = []
    maybe_fire(point, step, poison=lambda: fired.append(True))
    return bool(fired)


def maybe_fire(point: str, step: int, poison: Callable[[], None] | None = None) -> None:
    """Fire the faults configured for this point, step, rank and restart (no-op normally)."""
    for f in _here(point, step):
        rank = int(os.environ.get("RANK", "0"))
        said = f"gpufleet-fault: {f.action} at {point}={step} on rank {rank}"
        if f.action == "pause":
            _pause(said)
            continue
        print(said, file=sys.stderr, flush=True)
        if f.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.action == "exit":
            os._exit(1)
        elif f.action == "nan" and poison is not None:
            poison()
        elif f.action == "device":
            raise lost_device()
        elif f.action == "hang":
            while True:  # a hung rank: alive, holding its peers in the next collective
                time.sleep(3600)


def _pause(said: str) -> None:
    """Say ``said``, then wait until a signal whose handler is Python's (the preemption
    guard's SIGTERM and SIGINT) has come, and its handler ran. The handlers are wrapped before
    it is said, so that a signal sent once it is said is never missed."""
    came = threading.Event()
    handlers = (signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT))
    wrapped: dict[int, Callable[[int, FrameType | None], Any]] = {
        sig: handler
        for sig, handler in zip((signal.SIGTERM, signal.SIGINT), handlers, strict=True)
        if callable(handler)
    }

    def noted(signum: int, frame: FrameType | None) -> None:
        came.set()
        wrapped[signum](signum, frame)

    for sig in wrapped:
        signal.signal(sig, noted)
    try:
        print(said, file=sys.stderr, flush=True)
        while not came.wait(0.1):  # a signal's handler runs between these waits
            pass
    finally:
        for sig, handler in wrapped.items():
            signal.signal(sig, handler)
