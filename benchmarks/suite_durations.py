"""The test suite's time, per test module, before and after a change: reads the JUnit XML files
of two runs (`pytest --junitxml=FILE`, whose per-test time includes its setup and teardown)
and writes a Markdown table and the JSON of every test's duration.

    .venv/bin/python -m pytest -q --durations=0 --junitxml=before.xml   # and after.xml
    python benchmarks/suite_durations.py before.xml after.xml -o benchmarks/results/NAME
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def durations(junit: Path) -> dict[str, float]:
    """Seconds per test id (module.path::name) from a JUnit XML file."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        out[f"{case.get('classname')}::{case.get('name')}"] = float(case.get("time") or 0)
    return out


def per_module(tests: dict[str, float]) -> dict[str, tuple[int, float]]:
    """(tests, seconds) per module."""
    sums: dict[str, list[float]] = defaultdict(list)
    for test_id, seconds in tests.items():
        sums[test_id.split("::")[0]].append(seconds)
    return {module: (len(times), sum(times)) for module, times in sums.items()}


def table(before: dict[str, float], after: dict[str, float]) -> str:
    """The Markdown table: one row per module, slowest first, and the totals."""
    old, new = per_module(before), per_module(after)
    rows = ["| module | tests | before (s) | after (s) | after / before |"]
    rows.append("|---|---:|---:|---:|---:|")
    for module in sorted(set(old) | set(new), key=lambda m: -old.get(m, (0, 0.0))[1]):
        n_old, s_old = old.get(module, (0, 0.0))
        n_new, s_new = new.get(module, (0, 0.0))
        ratio = f"{s_new / s_old:.2f}" if s_old >= 1 else ""
        rows.append(f"| {module} | {n_new or n_old} | {s_old:.1f} | {s_new:.1f} | {ratio} |")
    total_old, total_new = sum(before.values()), sum(after.values())
    rows.append(
        f"| **all** | {len(after)} | {total_old:.1f} | {total_new:.1f} | "
        f"{total_new / total_old:.2f} |"
    )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True, help="path without suffix")
    args = parser.parse_args()
    before, after = durations(args.before), durations(args.after)
    args.output.with_suffix(".json").write_text(
        json.dumps({"before": before, "after": after}, indent=1, sort_keys=True) + "\n"
    )
    print(table(before, after))


if __name__ == "__main__":
    main()
