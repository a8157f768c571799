"""Line and branch coverage per package of gpufleet, checked against the floors in pyproject.toml
(`[tool.gpufleet.coverage-floor]`): `make test` and `make coverage` run it on the combined data
(docs/coverage.md).

    python scripts/coverage_report.py COVERAGE_JSON [--markdown]

Exit 1 when a package is below its floor, naming it. A floor is a measured figure rounded down,
less a point (a line that runs only when a race goes one way must not fail CI); a figure more
than two points above its floor is printed with the floor to commit (floors only move up).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE_ROOT = "src/gpufleet/"


def package_of(path: str) -> str:
    """`runtime` for src/gpufleet/runtime/trainer.py, `gpufleet` for a top-level module."""
    rel = path.split(PACKAGE_ROOT, 1)[1]
    return rel.split("/", 1)[0] if "/" in rel else "gpufleet"


def per_package(report: dict) -> dict[str, tuple[int, int, int, int]]:
    """Covered and total lines and branches by package (and `total`)."""
    sums: dict[str, list[int]] = {}
    for path, entry in report["files"].items():
        s = entry["summary"]
        figures = (s["covered_lines"], s["num_statements"])
        figures += (s.get("covered_branches", 0), s.get("num_branches", 0))
        for key in (package_of(path), "total"):
            row = sums.setdefault(key, [0, 0, 0, 0])
            row[:] = [a + b for a, b in zip(row, figures, strict=True)]
    return {key: (r[0], r[1], r[2], r[3]) for key, r in sums.items()}


def percent(covered: int, total: int) -> float:
    return 100.0 * covered / total if total else 100.0


def floors() -> dict[str, list[float]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(config["tool"]["gpufleet"]["coverage-floor"])


def check(figures: dict[str, tuple[int, int, int, int]]) -> list[str]:
    """One line per package below its floor (lines or branches)."""
    below = []
    for package, (line_floor, branch_floor) in floors().items():
        if package not in figures:
            below.append(f"{package}: not measured (floor {line_floor} % lines)")
            continue
        lines, branches = _rates(figures[package])
        if lines < line_floor or branches < branch_floor:
            below.append(
                f"{package}: {lines:.1f} % lines, {branches:.1f} % branches; "
                f"floor {line_floor} % / {branch_floor} %"
            )
    return below


def _rates(row: tuple[int, int, int, int]) -> tuple[float, float]:
    return percent(row[0], row[1]), percent(row[2], row[3])


def table(figures: dict[str, tuple[int, int, int, int]], markdown: bool) -> str:
    order = [*sorted(k for k in figures if k != "total"), "total"]
    floor = floors()
    out = []
    if markdown:
        out += ["| package | lines | branches | floor |", "|---|---|---|---|"]
    for key in order:
        (lines, branches), row = _rates(figures[key]), figures[key]
        at = "/".join(f"{v:g}" for v in floor.get(key, [])) or "-"
        if markdown:
            out.append(f"| {key} | {lines:.1f} % | {branches:.1f} % | {at} |")
        else:
            out.append(
                f"{key:<12} lines {lines:5.1f} % ({row[0]}/{row[1]})  "
                f"branches {branches:5.1f} % ({row[2]}/{row[3]})  floor {at}"
            )
    return "\n".join(out)


def raises(figures: dict[str, tuple[int, int, int, int]]) -> list[str]:
    """Floors that the figures exceed by more than two points: what to commit."""
    out = []
    for package, (line_floor, branch_floor) in floors().items():
        lines, branches = _rates(figures.get(package, (0, 0, 0, 0)))
        if lines - line_floor > 2 or branches - branch_floor > 2:
            out.append(f"{package} = [{int(lines) - 1}, {int(branches) - 1}]")
    return out


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0]).is_file():
        print("usage: coverage_report.py COVERAGE_JSON [--markdown]", file=sys.stderr)
        return 2
    figures = per_package(json.loads(Path(argv[0]).read_text()))
    print(table(figures, markdown="--markdown" in argv))
    up = raises(figures)
    if up:
        print("coverage: above the floor, raise it in pyproject.toml: " + "; ".join(up))
    below = check(figures)
    for line in below:
        print(f"coverage: below the floor: {line}", file=sys.stderr)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
