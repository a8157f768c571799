"""The coverage report per package and its floors (scripts/coverage_report.py, docs/coverage.md):
figures summed per package, a package under its floor fails naming it, and no commit lowered a
floor."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "coverage_report.py"


def _report(files: dict[str, tuple[int, int, int, int]]) -> dict:
    """A `coverage json` report: covered and total lines, covered and total branches per file."""
    return {
        "files": {
            f"/clone/src/gpufleet/{path}": {
                "summary": {
                    "covered_lines": c, "num_statements": n,
                    "covered_branches": cb, "num_branches": nb,
                }
            }
            for path, (c, n, cb, nb) in files.items()
        }
    }  # fmt: skip


def _floors() -> dict[str, list[float]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(config["tool"]["gpufleet"]["coverage-floor"])


def _run(tmp_path: Path, report: dict) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "coverage.json"
    path.write_text(json.dumps(report))
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, check=False
    )


def test_figures_are_summed_per_package(tmp_path: Path) -> None:
    files = {f"{p}/a.py": (10, 10, 4, 4) for p in _floors() if p != "total"}
    files |= {"runtime/b.py": (5, 10, 1, 2), "errors.py": (3, 3, 0, 0)}
    done = _run(tmp_path, _report(files))
    assert done.returncode in (0, 1), done.stderr
    runtime = next(line for line in done.stdout.splitlines() if line.startswith("runtime "))
    assert "lines  75.0 % (15/20)" in runtime and "branches  83.3 % (5/6)" in runtime
    assert any(line.startswith("gpufleet ") for line in done.stdout.splitlines())


def test_a_package_under_its_floor_fails_naming_it(tmp_path: Path) -> None:
    floors = {p: f for p, f in _floors().items() if p != "total" and f[0] > 0}
    if not floors:
        pytest.skip("no package floor above 0 in pyproject.toml")
    package = sorted(floors)[0]
    files = {f"{p}/a.py": (100, 100, 10, 10) for p in floors}
    files[f"{package}/a.py"] = (1, 100, 10, 10)
    done = _run(tmp_path, _report(files))
    assert done.returncode == 1
    assert f"below the floor: {package}: 1.0 % lines" in done.stderr


def test_an_unmeasured_package_with_a_floor_fails(tmp_path: Path) -> None:
    done = _run(tmp_path, _report({"elsewhere/a.py": (1, 1, 0, 0)}))
    named = [p for p in _floors() if p != "total"]
    assert done.returncode == (1 if named else 0)
    for package in named:
        assert f"{package}: not measured" in done.stderr


def _floors_at(commit: str) -> dict[str, list[float]] | None:
    shown = subprocess.run(
        ["git", "show", f"{commit}:pyproject.toml"], cwd=REPO, capture_output=True, text=True
    )
    if shown.returncode != 0:
        return None
    config = tomllib.loads(shown.stdout)
    return config.get("tool", {}).get("gpufleet", {}).get("coverage-floor")


def test_no_commit_lowered_a_floor() -> None:
    """The floors only move up: along every commit that changed pyproject.toml (and this
    working tree), no package's floor went down."""
    log = subprocess.run(
        ["git", "log", "--format=%H", "-n", "200", "--", "pyproject.toml"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip("no git history of pyproject.toml here")
    history = [_floors_at(c) for c in reversed(log.stdout.split())] + [_floors()]
    floors = [f for f in history if f is not None]
    for before, after in itertools.pairwise(floors):
        for package, (lines, branches) in before.items():
            now = after.get(package)
            assert now is not None, f"floor of {package} removed"
            assert now[0] >= lines and now[1] >= branches, f"floor of {package} lowered"
