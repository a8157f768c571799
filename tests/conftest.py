"""Fixtures and pytest hooks only: a scratch directory checked for orphan processes, the
session's cache, the coverage scope, the skips by marker and the order of the work units (the
clusters' fixtures: tests/cluster/conftest.py). The helpers the tests import live in
tests/support/ (tests/README.md)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support.coverage import hold_environment, measured_children
from tests.support.procs import wait_no_processes
from tests.support.units import CONTROL_PLANE, UNMEASURED_SLOW, unit_seconds, work_unit

__all__ = ["measured_children"]  # the coverage scope's module fixture (tests/support/coverage.py)
# What each test costs, per phase, in its report and the JUnit XML (benchmarks/suite_durations.py);
# costly fixtures shared by several modules, torn down after their last test.
pytest_plugins = ["tests.support.timing", "tests.support.sharing"]

# Property tests: `ci` (the default, `make test`) draws the same examples on every run, each
# test's seed derived from its name, so CI never fails at random; `explore` (`make fuzz`) draws
# new ones each run and keeps failures in .hypothesis/ to replay. Both print the failing example
# and the blob that reproduces it (@reproduce_failure).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """A process that runs tests passes coverage.py's environment on only where in scope; the
    pytest-xdist controller keeps it for the workers it starts."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        hold_environment()


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A scratch working directory; fails the test if processes started there outlive it."""
    yield tmp_path
    left = wait_no_processes(str(tmp_path))
    for p in left:
        p.kill()
    assert not left, f"orphan processes: {[(p.pid, p.cmdline()) for p in left]}"


@pytest.fixture(autouse=True)
def signal_handlers_kept() -> Iterator[None]:
    """SIGTERM's and SIGINT's handlers of this process put back after each test. A Trainer
    preempted in this process ignores both after its agreed stop (gpufleet.runtime.preemption:
    it exits 75 next); left so, every process a later test starts inherits the ignored SIGTERM
    and outlives its stop (seen: test_launch_orphans after test_trainer in one worker)."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The session's own gpufleet cache (the digits arrays): nothing read from, or left in, the
    user's; the first worker of the session fills it, the others read it."""
    from gpufleet.runtime.context import ENV_CACHE_DIR

    os.environ[ENV_CACHE_DIR] = str(tmp_path_factory.mktemp("gpufleet-cache"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse control-plane tests outside tests/cluster/ or without their marker; skip `gpu`
    tests without CUDA and `cluster` tests without KUBECONFIG, with the reason; order the
    modules (work_unit)."""
    check_control_plane_tests(items)
    in_one_process = not hasattr(config, "workerinput")
    slow = {work_unit(item.nodeid) for item in items if "slow" in item.keywords}
    measured = unit_seconds()

    def rank(item: pytest.Item) -> tuple[Any, ...]:
        unit = work_unit(item.nodeid)
        real = item.get_closest_marker("realnodes") is not None  # their cluster starts last
        if in_one_process:
            return (unit == CONTROL_PLANE, real)
        guess = UNMEASURED_SLOW if unit in slow else 0.0
        return (unit != CONTROL_PLANE, -measured.get(unit, guess), unit, real)

    items.sort(key=rank)
    import torch

    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    no_cluster = pytest.mark.skip(reason="needs a live Kubernetes cluster (KUBECONFIG unset)")
    not_root = pytest.mark.skip(reason="real nodes change the host: run as root")
    for item in items:
        # The markers themselves, not item.keywords: keywords also hold the names of the
        # test's folders, and every test under tests/cluster/ would count as marked `cluster`.
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("cluster") and not os.environ.get("KUBECONFIG"):
            item.add_marker(no_cluster)
        if item.get_closest_marker("realnodes") and os.geteuid() != 0:
            item.add_marker(not_root)


def check_control_plane_tests(items: list[pytest.Item]) -> None:
    """A test using the devcluster fixture is marked `controlplane`, and a `controlplane` test
    lives in tests/cluster/: elsewhere it would start a second control plane in its own worker."""
    uses = {item.nodeid.split("::")[0]: item for item in items
            if "devcluster" in getattr(item, "fixturenames", ())}  # fmt: skip
    unmarked = sorted(
        m for m, item in uses.items() if item.get_closest_marker("controlplane") is None
    )
    if unmarked:
        raise pytest.UsageError("tests using the devcluster fixture are marked controlplane "
                                f"(pytestmark): {', '.join(unmarked)}")  # fmt: skip
    strays = sorted({item.nodeid.split("::")[0] for item in items
                     if item.get_closest_marker("controlplane") is not None
                     and work_unit(item.nodeid) != CONTROL_PLANE})  # fmt: skip
    if strays:
        raise pytest.UsageError(f"controlplane tests belong in {CONTROL_PLANE}/: "
                                f"{', '.join(strays)}")  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's own scope scheduler, by work_unit (its `--dist loadgroup` marks no longer group
    on pytest 9.2: pytest-xdist issue 1386), in the order the workers collected."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return ByWorkUnit(config, log)
