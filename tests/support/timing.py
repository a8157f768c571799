"""What each test costs, per phase, for the suite's time table (benchmarks/suite_durations.py).

A pytest plugin (tests/conftest.py loads it): for the set-up, the call and the tear-down of
every test it adds to the test's report the wall seconds and the CPU seconds of the process that
ran it, its waited-for children included (``os.times``: the CLIs, launchers and workers a test
started and reaped; a cluster's processes count where they are reaped, at the fixture's tear-down),
with the worker's name and when the set-up began. pytest's JUnit XML writes them as the
test's properties (``--junitxml``), and pytest-xdist carries them from its workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from typing import Any

import pytest

# The property names, one home: benchmarks/suite_durations.py reads them.
PHASES = ("setup", "call", "teardown")
STARTED = "started"  # seconds since the epoch when the set-up began
WORKER = "worker"  # pytest-xdist's worker id, "main" in one process

_MEASURED = pytest.StashKey[dict[str, tuple[float, float]]]()


def cpu_seconds() -> float:
    """This process's CPU time and its reaped children's, user and system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    item.user_properties.append((STARTED, round(time.time(), 3)))
    worker = getattr(item.config, "workerinput", {}).get("workerid", "main")
    item.user_properties.append((WORKER, worker))
    return (yield from _measured(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _measured(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Any) -> Generator[None, Any, Any]:
    return (yield from _measured(item, "teardown"))


def _measured(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    try:
        return (yield)
    finally:
        item.stash.setdefault(_MEASURED, {})[phase] = (
            time.perf_counter() - wall,
            cpu_seconds() - cpu,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Before the tear-down's report is made (JUnit XML writes that report's properties):
    every phase's wall and CPU seconds."""
    if call.when == "teardown":
        for phase, (wall, cpu) in item.stash.get(_MEASURED, {}).items():
            item.user_properties.append((f"wall_{phase}", round(wall, 3)))
            item.user_properties.append((f"cpu_{phase}", round(cpu, 3)))
    return (yield)
