"""Where the test suite's time goes: per test module, per pytest-xdist worker, and the largest
set-ups and tear-downs (the clusters' starts, the reference runs, the servers a module starts),
from the JUnit XML of one run; with ``--before``, each module against an earlier run.

Every test's properties come from tests/support/timing.py (wall and CPU seconds per phase, the
worker, when it began); a file without them (an older run) still gives each test's total time.

    make measured PYTEST_ARGS="--junitxml=after.xml"
    python benchmarks/suite_durations.py after.xml [--before before.xml] \\
        --wall SECONDS [-o PATH]

Writes benchmarks/results/suite-durations_<hardware>_<date>.md (or PATH.md) and the JSON of
every test's times beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests.support: units, timing
from common import environment, environment_section, result_path
from tests.support.timing import PHASES, STARTED, WORKER

REPO = Path(__file__).resolve().parents[1]

SHOWN = 25  # rows of the set-up and tear-down tables


@dataclass
class Test:
    """One test's time (seconds): its total, and per phase where the run recorded them."""

    test_id: str
    seconds: float
    worker: str = ""
    started: float = 0.0
    wall: dict[str, float] | None = None
    cpu: dict[str, float] | None = None

    @property
    def module(self) -> str:
        return self.test_id.split("::")[0]

    @property
    def cpu_seconds(self) -> float:
        return sum((self.cpu or {}).values())


def read(junit: Path) -> list[Test]:
    """Every test case of a JUnit XML file, with its timing properties."""
    tests = []
    for case in ET.parse(junit).iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        test = Test(f"{case.get('classname')}::{case.get('name')}", float(case.get("time") or 0))
        if "wall_call" in props or "wall_setup" in props:
            test.wall = {ph: float(props.get(f"wall_{ph}", 0)) for ph in PHASES}
            test.cpu = {ph: float(props.get(f"cpu_{ph}", 0)) for ph in PHASES}
            test.worker, test.started = props.get(WORKER, ""), float(props.get(STARTED, 0))
        tests.append(test)
    return tests


def per_module(tests: list[Test]) -> dict[str, dict[str, Any]]:
    """Per module: tests, wall, CPU, set-up plus tear-down wall, and the worker(s) that ran it."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0, "fixtures": 0.0, "workers": set()}
    )
    for t in tests:
        row = out[t.module]
        row["tests"] += 1
        row["wall"] += t.seconds
        row["cpu"] += t.cpu_seconds
        row["fixtures"] += (t.wall or {}).get("setup", 0) + (t.wall or {}).get("teardown", 0)
        if t.worker:
            row["workers"].add(t.worker)
    return dict(out)


def per_worker(tests: list[Test]) -> dict[str, dict[str, float]]:
    """Per worker: busy seconds, CPU seconds, and its first start and last end."""
    out: dict[str, dict[str, float]] = {}
    for t in (t for t in tests if t.worker):
        w = out.setdefault(t.worker, {"busy": 0.0, "cpu": 0.0, "first": t.started, "last": 0.0})
        w["busy"] += t.seconds
        w["cpu"] += t.cpu_seconds
        w["first"] = min(w["first"], t.started)
        w["last"] = max(w["last"], t.started + t.seconds)
    return out


def module_table(tests: list[Test], before: list[Test] | None) -> list[str]:
    new, old = per_module(tests), per_module(before or [])
    rows = ["| module | tests | wall (s) | CPU (s) | CPU / wall | set-up + tear-down (s) | "
            "worker | before (s) |", "|---|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for module in sorted(set(new) | set(old), key=lambda m: -new.get(m, {"wall": 0})["wall"]):
        r = new.get(module) or {"tests": 0, "wall": 0.0, "cpu": 0.0, "fixtures": 0.0}
        ratio = f"{r['cpu'] / r['wall']:.2f}" if r["wall"] >= 1 and r["cpu"] else ""
        prior = f"{old[module]['wall']:.1f}" if module in old else ""
        workers = ",".join(sorted(r.get("workers", ())))
        rows.append(f"| {module} | {r['tests']} | {r['wall']:.1f} | {r['cpu']:.1f} | {ratio} | "
                    f"{r['fixtures']:.1f} | {workers} | {prior} |")  # fmt: skip
    total = sum(t.seconds for t in tests)
    prior_total = f"{sum(t.seconds for t in before):.1f}" if before else ""
    cpu = sum(t.cpu_seconds for t in tests)
    rows.append(f"| **all** | {len(tests)} | {total:.1f} | {cpu:.1f} | | | | {prior_total} |")
    return rows


def phase_table(tests: list[Test], phase: str) -> list[str]:
    """The largest ``phase`` times: a module or session fixture's cost lands in its first
    test's set-up and its last test's tear-down."""
    timed = sorted((t for t in tests if t.wall), key=lambda t: -(t.wall or {})[phase])[:SHOWN]
    rows = [f"| test | {phase} wall (s) | {phase} CPU (s) |", "|---|---:|---:|"]
    for t in timed:
        rows.append(f"| {t.test_id} | {(t.wall or {})[phase]:.1f} | {(t.cpu or {})[phase]:.1f} |")
    return rows


def report(tests: list[Test], before: list[Test] | None, wall: float | None) -> str:
    workers = per_worker(tests)
    lines = [f"Tests: {len(tests)}; their time summed over the workers: "
             f"{sum(t.seconds for t in tests):.0f} s."]  # fmt: skip
    if wall:
        lines.append(f"The suite's wall time (pytest's own line): {wall:.0f} s.")
    if workers:
        lines += ["", "| worker | busy (s) | CPU (s) | from first start to last end (s) |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for name, w in sorted(workers.items()):
            lines.append(f"| {name} | {w['busy']:.0f} | {w['cpu']:.0f} | "
                         f"{w['last'] - w['first']:.0f} |")  # fmt: skip
    lines += ["", "## Per module", "", *module_table(tests, before)]
    if any(t.wall for t in tests):
        for phase in ("setup", "teardown"):
            lines += ["", f"## The largest {phase}s", "", *phase_table(tests, phase)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="the run's JUnit XML")
    parser.add_argument("--before", type=Path, help="an earlier run's JUnit XML")
    parser.add_argument("--wall", type=float, help="the suite's wall seconds, as pytest said")
    parser.add_argument("-o", "--output", type=Path, help="path without suffix (.md, .json)")
    parser.add_argument("--commit", help="the commit the run measured (default: this HEAD)")
    parser.add_argument("--units", type=Path, help="write each work unit's seconds here "
                        "(tests/durations.json: the order the workers take them in)")  # fmt: skip
    args = parser.parse_args()
    tests = read(args.junit)
    before = read(args.before) if args.before else None
    text = report(tests, before, args.wall)
    print(text)
    out = args.output or result_path("suite-durations").with_suffix("")
    env = {**environment(), "commit": args.commit or commit()}
    out.with_suffix(".md").write_text("\n".join(
        ["# Where the suite's time goes", "", text, *environment_section(env)]))  # fmt: skip
    doc: dict[str, Any] = {"environment": env, "tests": [asdict(t) for t in tests]}
    if before is not None:
        doc["before"] = [asdict(t) for t in before]
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    if args.units:
        units = {"measured": f"{env['commit']} on {env['date']}", "units": unit_seconds(tests)}
        args.units.write_text(json.dumps(units, indent=1, sort_keys=True) + "\n")


def module_path(test: Test) -> str:
    """tests/x/test_y.py of a JUnit test id (its classname is the dotted module, then any
    class in it)."""
    parts = test.module.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (REPO / path).is_file():
            return path
    return "/".join(parts) + ".py"


def unit_seconds(tests: list[Test]) -> dict[str, float]:
    """Seconds per work unit (tests/support/units.py), rounded to the second."""
    from tests.support.units import work_unit

    sums: dict[str, float] = defaultdict(float)
    for t in tests:
        sums[work_unit(module_path(t))] += t.seconds
    return {unit: round(seconds) for unit, seconds in sums.items()}


def commit() -> str:
    """The checked-out commit the run measured (the clone's HEAD)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(__file__).parent, check=False)  # fmt: skip
    return head.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
