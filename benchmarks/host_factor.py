"""How much slower one host runs the suite than another: the tests that two suite-durations
results (benchmarks/suite_durations.py's JSON) both hold, per test directory, their CPU and
wall seconds on each host and the ratio. The unit tests change with neither the cluster nor the
caches: their ratio is the hosts' own.

    python benchmarks/host_factor.py REFERENCE.json OTHER.json [-o PATH]

Writes benchmarks/results/host-factor_<hardware>_<date>.md (or PATH.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, environment_section, result_path
from suite_durations import Test


def read(path: Path) -> tuple[dict[str, str], dict[str, Test]]:
    """A suite-durations result: the host it ran on (its environment), and its tests by id
    (suite_durations.Test, as it wrote them)."""
    doc = json.loads(path.read_text())
    return doc["environment"], {t["test_id"]: Test(**t) for t in doc["tests"]}


def part(test_id: str) -> str:
    """tests/<part>/ of a test id (tests.unit.test_x::test_y: unit)."""
    parts = test_id.split("::")[0].split(".")
    return parts[1] if len(parts) > 2 else parts[0]


def factors(reference: dict[str, Test], other: dict[str, Test]) -> list[dict[str, Any]]:
    """Per test directory, then all: the shared tests' count, CPU and wall seconds on each
    host, and the ratios other / reference."""
    shared = sorted(set(reference) & set(other))
    groups = sorted({part(t) for t in shared})
    rows = []
    for name in [*groups, "all"]:
        ids = [t for t in shared if name in ("all", part(t))]
        hosts = (reference, other)
        row = {"part": name, "tests": len(ids),
               "cpu": [sum(h[t].cpu_seconds for t in ids) for h in hosts],
               "wall": [sum(h[t].seconds for t in ids) for h in hosts]}  # fmt: skip
        for kind in ("cpu", "wall"):
            ref, oth = row[kind]
            row[f"{kind}_ratio"] = round(oth / ref, 2) if ref else None
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| tests/ | tests | CPU-s reference | CPU-s other | CPU ratio "
             "| wall-s reference | wall-s other | wall ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['part']} | {r['tests']} | {r['cpu'][0]:.0f} | {r['cpu'][1]:.0f} | "
                     f"{r['cpu_ratio']} | {r['wall'][0]:.0f} | {r['wall'][1]:.0f} | "
                     f"{r['wall_ratio']} |")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path, help="a suite-durations JSON of one host")
    parser.add_argument("other", type=Path, help="a suite-durations JSON of another")
    parser.add_argument("-o", "--output", type=Path, help="path without suffix (.md, .json)")
    args = parser.parse_args()
    (ref_host, reference), (other_host, other) = read(args.reference), read(args.other)
    rows = factors(reference, other)
    hosts = [ref_host, other_host]
    lines = ["# The same tests on two hosts", "",
             *[f"- {which}: `{p.name}` ({h.get('cpu')}, commit {h.get('commit')})"
               for which, p, h in zip(("reference", "other"), (args.reference, args.other),
                                      hosts, strict=True)],
             "", *table(rows), ""]  # fmt: skip
    print("\n".join(lines))
    out = args.output or result_path("host-factor").with_suffix("")
    out.with_suffix(".md").write_text("\n".join([*lines, *environment_section(environment())]))
    out.with_suffix(".json").write_text(json.dumps({"hosts": hosts, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
