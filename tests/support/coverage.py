"""Which test modules' processes coverage.py measures (docs/coverage.md).

`make test` and `make coverage` run pytest under ``coverage run``. With ``patch = subprocess``
(pyproject.toml) coverage.py puts its configuration in the environment, and every interpreter of
the venv started with it measures itself: the pytest-xdist workers, and every CLI, node agent,
worker and pod launcher a test starts. Each test process is measured from its start; what its
tests start is measured only for the modules in scope: measuring costs ~28 % more CPU and ~21 %
more time (benchmarks/results/coverage-overhead_*), too much for the whole suite within CI's
time (71 min of 90 before), so
`make test` measures the tests of the distributed parts (runtime/, launch/, the local runs,
checkpoints, the chaos tests) and `make coverage` all of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# GPUFLEET_COVERAGE_SCOPE: `distributed` (make test) or `all` (make coverage).
ENV_SCOPE = "GPUFLEET_COVERAGE_SCOPE"
# What coverage.py's subprocess patch and its .pth read (coverage/patch.py, control.py).
COVERAGE_ENV = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
DISTRIBUTED = (
    "tests/unit/",
    "tests/chaos/",
    "tests/integration/test_local_run.py",
    "tests/integration/test_pod_launcher.py",
    "tests/integration/test_checkpoint_tiers.py",
    "tests/integration/test_checkpoint_tiers_nodes.py",
    "tests/integration/test_s3_checkpoints.py",
    "tests/integration/test_mpi_worker.py",
    "tests/integration/test_watchdog.py",
    "tests/integration/test_secret_argv.py",
    "tests/integration/test_fsdp_gloo.py",
)

# The coverage environment of this process, taken out of os.environ at configure time so that
# only the modules in scope pass it on (measured_children).
_held: dict[str, str] = {}


def hold_environment() -> None:
    """Take coverage.py's variables out of this process's environment (pytest_configure)."""
    for name in COVERAGE_ENV:
        if name in os.environ:
            _held[name] = os.environ.pop(name)


def in_scope(module: str) -> bool:
    """Whether the processes that `module`'s tests start are measured."""
    scope = os.environ.get(ENV_SCOPE, "distributed")
    return scope == "all" or module.startswith(DISTRIBUTED)


@pytest.fixture(scope="module", autouse=True)
def measured_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """Give this module's tests the coverage environment back when its module is in scope."""
    module = request.node.nodeid.split("::")[0]
    if not _held or not in_scope(module):
        yield
        return
    os.environ.update(_held)
    try:
        yield
    finally:
        for name in _held:
            os.environ.pop(name, None)
