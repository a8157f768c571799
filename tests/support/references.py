"""The local runs that the real-node tests compare with: `gpufleet run` of the same job on this
machine ends with the weights that the job on real pods must end with (its state digest).

Each shape (world, steps, checkpoint interval, framework) runs once per worker process, and
not at all when an earlier session ran it with the same sources, packages and CPU (its
summary is on disk: tests/support/refcache.py).
``prefetch`` runs the shapes of REFERENCES in the background, one after another, at the lowest
CPU priority, from the start of the real-node cluster. The real-node tests mostly wait on
controllers (0.03 to 0.5 CPU-s per second of wall time), so the runs use CPU that is idle there.
A test would otherwise spend 20 to 60 s of the cluster unit's wall time on each shape
(benchmarks/results/suite-durations_*). A test that asks for a shape still queued runs it
itself. A test that asks for a running shape raises that run to the normal priority and waits
for it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support import refcache
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.coverage import COVERAGE_ENV
from tests.support.specs import digits_job, write_spec

WORKLOAD = {"name": "digits", "steps": 40, "batchSize": 32, "logEvery": 10}
SHORT = (40, 10)  # steps, checkpoint every: the engines' runs (WORKLOAD)
LONG = (1500, 50)  # long enough to be interrupted: device loss, node loss, preemption, crash
PARTITIONED = (4000, 100)  # the partition: status reads the resumed steps (100-200 per s)
Shape = tuple[int, int, int, int, str]  # nodes, processes per node, steps, every, framework
# In the order that tests/cluster/'s modules first ask for them (alphabetical).
REFERENCES: tuple[Shape, ...] = (
    (2, 1, *LONG, "pytorch"), (2, 1, *PARTITIONED, "pytorch"), (2, 1, *SHORT, "ray"),
    (2, 1, *SHORT, "pytorch"), (2, 2, *SHORT, "pytorch"), (2, 1, *SHORT, "tensorflow"),
)  # fmt: skip
TIMEOUT = 600.0  # one run, a Ray cluster's start included, on a loaded machine


@dataclass
class _Runs:
    queued: list[Shape] = field(default_factory=list)
    running: dict[Shape, subprocess.Popen[str]] = field(default_factory=dict)
    done: dict[Shape, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)
    thread: threading.Thread | None = None


_RUNS = _Runs()


def _doc(root: Path, shape: Shape) -> dict[str, Any]:
    """The job of ``shape``, checkpointing under ``root``."""
    nodes, procs, steps, every, framework = shape
    name = f"local-{framework}-{nodes}x{procs}-{steps}-{every}"
    checkpoint = {"dir": str(root / name / "ckpt"), "everySteps": every}
    return digits_job(name, workload={**WORKLOAD, "steps": steps}, nodes=nodes,
                      procsPerNode=procs, checkpoint=checkpoint, framework=framework)  # fmt: skip


def _cached(shape: Shape) -> subprocess.CompletedProcess[str] | None:
    """An earlier session's run of ``shape`` (tests/support/refcache.py), if any."""
    summary = refcache.load(_doc(Path(), shape))
    return None if summary is None else subprocess.CompletedProcess([], 0, summary, "")


def _start(root: Path, shape: Shape, background: bool) -> subprocess.Popen[str]:
    """A run of ``shape``: in the background at the lowest CPU priority, else at the normal."""
    doc = _doc(root, shape)
    name = doc["metadata"]["name"]
    argv = gpufleet_cmd("run", str(write_spec(root, doc, f"{name}.yaml")), "-o", "json")
    env = cli_env()
    if background:  # never measured: else whichever module runs at its start would decide
        for var in COVERAGE_ENV:  # (tests/support/coverage.py), and the floors would wobble
            env.pop(var, None)
    return subprocess.Popen(["nice", "-n", "19" if background else "0", *argv], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the run's process group (gone already when it ended on its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _finish(shape: Shape, proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        err += f"\n(the reference run of {shape} took over {TIMEOUT:g} s)"
    if proc.returncode == 0:
        refcache.store(_doc(Path(), shape), out)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _background(root: Path) -> None:
    while True:
        with _RUNS.changed:
            if not _RUNS.queued:
                return
            shape = _RUNS.queued.pop(0)
            proc = _RUNS.running[shape] = _start(root, shape, background=True)
        done = _finish(shape, proc)
        with _RUNS.changed:
            del _RUNS.running[shape]
            if done.returncode == 0:  # else (stopped, or it failed) the test runs it itself
                _RUNS.done[shape] = done
            _RUNS.changed.notify_all()


def prefetch(root: Path, shapes: Sequence[Shape] = REFERENCES) -> None:
    """Run ``shapes`` (not yet run) in the background, in ``root``."""
    with _RUNS.changed:
        for shape in shapes:
            if shape not in _RUNS.done and (cached := _cached(shape)) is not None:
                _RUNS.done[shape] = cached
        _RUNS.queued = [s for s in shapes if s not in _RUNS.done and s not in _RUNS.running]
    _RUNS.thread = threading.Thread(target=_background, args=(root,), name="references",
                                    daemon=True)  # fmt: skip
    _RUNS.thread.start()


def stop_prefetch() -> None:
    """End the background runs (the one running is killed, with its process group)."""
    with _RUNS.changed:
        _RUNS.queued.clear()
        for proc in _RUNS.running.values():
            _kill(proc)
    if _RUNS.thread is not None:
        _RUNS.thread.join(TIMEOUT)
        _RUNS.thread = None


def _hurried(proc: subprocess.Popen[str]) -> None:
    """A background run that a test waits for, at the normal priority (root may lower it)."""
    try:
        top = psutil.Process(proc.pid)
        for each in [top, *top.children(recursive=True)]:
            each.nice(0)
    except psutil.Error:
        return


def local_digest(root: Path, nodes: int, procs: int, steps: int = SHORT[0],
                 every: int = SHORT[1], framework: str = "pytorch") -> str:  # fmt: skip
    """The state digest of the same job run here by `gpufleet run` (same world, same data,
    same framework): the same world and workload give the same weights whatever the job's name
    or checkpoint directory, so the tests that share a shape share one run."""
    shape = (nodes, procs, steps, every, framework)
    with _RUNS.changed:
        running = _RUNS.running.get(shape)
        if shape in _RUNS.queued:
            _RUNS.queued.remove(shape)  # run here, now
    if running is not None:
        _hurried(running)
    with _RUNS.changed:
        _RUNS.changed.wait_for(lambda: shape not in _RUNS.running, timeout=2 * TIMEOUT)
        run = _RUNS.done.get(shape) or _cached(shape)
    if run is None:
        run = _finish(shape, _start(root, shape, background=False))
        with _RUNS.changed:
            _RUNS.done[shape] = run
    assert run.returncode == 0, run.stderr[-3000:]
    return str(json.loads(run.stdout)["state_digest"])
