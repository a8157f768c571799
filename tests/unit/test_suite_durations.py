"""The suite's time table: tests/support/timing.py records each phase's wall and CPU seconds in a
real pytest run's JUnit XML, and benchmarks/suite_durations.py reads them per module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import suite_durations

from tests.support.paths import REPO

INNER = """
import time
import pytest

@pytest.fixture(scope="module")
def slow_fixture():
    time.sleep(0.3)
    yield
    time.sleep(0.2)

def test_first(slow_fixture):
    sum(i * i for i in range(1_000_000))

def test_second(slow_fixture):
    pass
"""


def test_each_phase_is_timed_and_a_module_fixture_lands_in_its_first_set_up_and_last_tear_down(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    junit = tmp_path / "run.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.timing",
         "-p", "no:cacheprovider", f"--rootdir={tmp_path}", f"--junitxml={junit}",
         str(tmp_path / "test_inner.py")],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    first, second = suite_durations.read(junit)
    assert first.test_id.endswith("test_inner::test_first") and first.worker == "main"
    assert first.wall and second.wall and first.cpu
    assert first.wall["setup"] >= 0.3 and second.wall["setup"] < 0.3
    assert second.wall["teardown"] >= 0.2 and first.wall["teardown"] < 0.2
    assert first.cpu["call"] > 0 and first.cpu["call"] > second.cpu_seconds
    assert second.started >= first.started > 0
    (row,) = suite_durations.per_module([first, second]).values()
    assert row["tests"] == 2 and row["workers"] == {"main"}
    assert row["fixtures"] >= 0.5 and row["wall"] == first.seconds + second.seconds


def test_seconds_per_work_unit_put_tests_cluster_and_joined_modules_together() -> None:
    """What tests/durations.json holds: the workers take the units in this order."""
    tests = [suite_durations.Test(test_id, seconds) for test_id, seconds in (
        ("tests.cluster.test_devcluster::a", 10.4), ("tests.cluster.test_realnodes::b", 20.0),
        ("tests.integration.test_serving::c", 3.0), ("tests.integration.test_serving_cli::d", 4.0),
        ("tests.unit.test_spec::e", 0.2),
    )]  # fmt: skip
    assert suite_durations.unit_seconds(tests) == {
        "tests/cluster": 30, "tests/integration/test_serving.py": 7, "tests/unit/test_spec.py": 0,
    }  # fmt: skip
