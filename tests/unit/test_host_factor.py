"""benchmarks/host_factor.py: the tests two suite-durations results share, per test directory,
with their CPU and wall seconds on each host and the ratio; a test only one run has is left out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import host_factor

from tests.support.paths import REPO


def result(path: Path, cpu: str, tests: dict[str, tuple[float, float]]) -> Path:
    """A suite-durations JSON: each test's (wall, CPU of its call) seconds."""
    doc: dict[str, Any] = {"environment": {"cpu": cpu, "commit": "abc1234"}, "tests": [
        {"test_id": t, "seconds": wall, "cpu": {"setup": 0.0, "call": used, "teardown": 0.0}}
        for t, (wall, used) in tests.items()]}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_the_shared_tests_ratio_per_directory_and_in_all(tmp_path: Path) -> None:
    reference = result(
        tmp_path / "a.json",
        "Intel",
        {
            "tests.unit.test_x::test_a": (1.0, 1.0),
            "tests.unit.test_x::test_b": (2.0, 1.0),
            "tests.cluster.test_c::test_c": (10.0, 2.0),
            "tests.unit.test_x::test_gone": (5.0, 5.0),
        },
    )
    other = result(
        tmp_path / "b.json",
        "AMD",
        {
            "tests.unit.test_x::test_a": (2.0, 2.0),
            "tests.unit.test_x::test_b": (4.0, 2.0),
            "tests.cluster.test_c::test_c": (15.0, 5.0),
            "tests.unit.test_x::test_new": (9.0, 9.0),
        },
    )
    rows = host_factor.factors(host_factor.read(reference)[1], host_factor.read(other)[1])
    by_part = {r["part"]: r for r in rows}
    assert list(by_part) == ["cluster", "unit", "all"]
    assert by_part["unit"]["tests"] == 2 and by_part["unit"]["cpu"] == [2.0, 4.0]
    assert (by_part["unit"]["cpu_ratio"], by_part["unit"]["wall_ratio"]) == (2.0, 2.0)
    assert (by_part["cluster"]["cpu_ratio"], by_part["cluster"]["wall_ratio"]) == (2.5, 1.5)
    assert by_part["all"]["tests"] == 3 and by_part["all"]["cpu"] == [4.0, 9.0]
    out = tmp_path / "factor"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "host_factor.py"),
                          str(reference), str(other), "-o", str(out)],
                         capture_output=True, text=True, cwd=REPO, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "| unit | 2 | 2 | 4 | 2.0 | 3 | 6 | 2.0 |" in out.with_suffix(".md").read_text()
    assert "- other: `b.json` (AMD, commit abc1234)" in run.stdout
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == rows
