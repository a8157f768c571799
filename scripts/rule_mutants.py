"""Mutation check of the Prometheus rules: does some promtool test fail for every change that
alters what a rule means?

Each mutant changes one thing in deploy/prometheus/gpufleet-rules.yaml: a threshold or factor
(halved, doubled), a comparison (> to >=, < to <=, == to !=, and flipped), an aggregation (avg,
sum, max, min swapped), or an alert's ``for:`` / ``keep_firing_for:`` (dropped, halved). It runs
against every tests/*.test.yaml with promtool; it is killed when any of them fails. Survivors
are printed; those listed in EQUIVALENT (with the reason the change cannot be seen) are not
counted against the kill rate; an EQUIVALENT entry whose mutant no longer survives is stale
and fails the check too. Label values in quotes (XID codes, type="uncorrected") and range
windows are left alone.

    python scripts/rule_mutants.py            # table; exit 1 if a non-equivalent mutant lives
    python scripts/rule_mutants.py -o json    # the same as JSON
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml"
TESTS = REPO / "deploy" / "prometheus" / "tests"

# A number standing alone in PromQL (not part of a name, a duration such as 10m, or a string).
NUMBER = re.compile(r"(?<![\w.:\"])(\d+(?:\.\d+)?)(?![\w.\"])")
COMPARISONS = {
    " > ": [" >= ", " < "],
    " < ": [" <= ", " > "],
    " >= ": [" > "],
    " <= ": [" < "],
    " == ": [" != "],
}
AGGREGATIONS = {"avg": ["max", "min"], "sum": ["max"], "max": ["min"], "min": ["max"]}

# (rule, mutation) -> why no test can tell the mutant from the rule.
EQUIVALENT: dict[tuple[str, str], str] = {
    ("pod:gpufleet_gpu_utilization:ratio", "> 0 -> >= 0"): (
        "the exporter writes gpufleet_gpu_allocated only for a container holding at least one "
        "share, so `> bool 0` and `>= bool 0` are both 1"
    ),
    ("GpufleetGpuXidHardware", "> 0 -> >= 0"): (
        "gpu:gpufleet_gpu_xid_errors:increase10m holds only positive values: an increase kept "
        "when > 0, or a new counter series kept when > 0"
    ),
    ("GpufleetGpuXidOther", "> 0 -> >= 0"): "as for GpufleetGpuXidHardware",
    ("GpufleetJobNoProgress", "max -> min (#2)"): (
        "every rank of a job reports the job's one hangTimeout, so max and min of it agree"
    ),
}


@dataclass(frozen=True)
class Mutant:
    rule: str
    mutation: str
    killed: bool = False


def _string_spans(expr: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r'"[^"]*"', expr)]


def _in_spans(at: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= at < b for a, b in spans)


def _expr_mutants(expr: str) -> Iterator[tuple[str, str]]:
    """(description, mutated expr) for each single change of ``expr``."""
    strings = _string_spans(expr)
    for m in NUMBER.finditer(expr):
        if _in_spans(m.start(), strings):
            continue
        value = float(m.group(1))
        for new in (value / 2, value * 2) if value else (1.0,):
            text = f"{new:g}"
            yield f"{m.group(1)} -> {text}", expr[: m.start()] + text + expr[m.end() :]
    for op, replacements in COMPARISONS.items():
        for m in re.finditer(re.escape(op), expr):
            if _in_spans(m.start(), strings):
                continue
            for new in replacements:
                mutated = expr[: m.start()] + new + expr[m.end() :]
                operand = _after(expr, m.end())
                yield f"{op.strip()} {operand} -> {new.strip()} {operand}", mutated
    for agg, replacements in AGGREGATIONS.items():
        found = re.finditer(rf"\b{agg}\b(?=\s*(?:by|without)?\s*\()", expr)
        for k, m in enumerate(found, start=1):
            for new in replacements:
                yield f"{agg} -> {new} (#{k})", expr[: m.start()] + new + expr[m.end() :]


def _after(expr: str, at: int) -> str:
    """The operand after a comparison, for a readable description (`> 0`, `< 0.05`)."""
    match = re.match(r"\s*(bool\s+)?([\w.]+)", expr[at:])
    return match.group(2) if match else "..."


def _halved(duration: str) -> str:
    m = re.fullmatch(r"(\d+)([smhd])", duration)
    if not m:
        raise ValueError(f"unexpected duration {duration!r}")
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)] // 2
    return f"{seconds}s"


def mutants(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(rule name, mutation, mutated rules document) for every single change."""
    for g, group in enumerate(doc["groups"]):
        for r, rule in enumerate(group["rules"]):
            name = rule.get("alert") or rule["record"]
            for description, expr in _expr_mutants(rule["expr"]):
                mutated = copy.deepcopy(doc)
                mutated["groups"][g]["rules"][r]["expr"] = expr
                yield name, description, mutated
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    dropped = copy.deepcopy(doc)
                    del dropped["groups"][g]["rules"][r][key]
                    yield name, f"no {key}", dropped
                    halved = copy.deepcopy(doc)
                    halved["groups"][g]["rules"][r][key] = _halved(rule[key])
                    yield name, f"{key} {rule[key]} -> {_halved(rule[key])}", halved


def survives(promtool: str, mutated: dict[str, Any], work: Path, rule: str) -> bool:
    """Whether every promtool test passes on the mutated rules. The test files that name the
    rule go first, one file at a time, up to the first that fails: the same verdict as all files
    at once, in about half the time (most mutants die in their own rule's file)."""
    (work / "gpufleet-rules.yaml").write_text(yaml.safe_dump(mutated, sort_keys=False))
    tests = sorted((work / "tests").glob("*.test.yaml"))
    for test in sorted(tests, key=lambda path: rule not in path.read_text()):
        done = subprocess.run([promtool, "test", "rules", test.name], cwd=work / "tests",
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        if done.returncode != 0:
            return False
    return True


def run(promtool: str) -> list[Mutant]:
    """Every mutant, killed or not; promtool runs in parallel, one directory per mutant."""
    doc = yaml.safe_load(RULES.read_text())
    with tempfile.TemporaryDirectory(prefix="gpufleet-mutants-") as tmp:

        def check(item: tuple[int, tuple[str, str, dict[str, Any]]]) -> Mutant:
            i, (name, description, mutated) = item
            work = Path(tmp) / str(i)
            shutil.copytree(TESTS, work / "tests")
            return Mutant(name, description, killed=not survives(promtool, mutated, work, name))

        if check((-1, ("", "", doc))).killed:
            raise SystemExit("error: the promtool tests fail on the unmutated rules")
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            return list(pool.map(check, enumerate(mutants(doc))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = parser.parse_args()
    promtool = shutil.which("promtool")
    if promtool is None:
        print("error: promtool not found (make tools)", file=sys.stderr)
        return 2
    results = run(promtool)
    living = [m for m in results if not m.killed]
    unexplained = [m for m in living if (m.rule, m.mutation) not in EQUIVALENT]
    stale = sorted(set(EQUIVALENT) - {(m.rule, m.mutation) for m in living})
    counted = len(results) - (len(living) - len(unexplained))
    summary = {
        "mutants": len(results),
        "killed": len(results) - len(living),
        "equivalent": len(living) - len(unexplained),
        "kill_rate_of_non_equivalent": (counted - len(unexplained)) / counted if counted else 1.0,
        "stale_equivalents": [f"{rule}: {mutation}" for rule, mutation in stale],
        "survivors": [
            asdict(m) | {"equivalent": EQUIVALENT.get((m.rule, m.mutation))} for m in living
        ],
    }
    if args.output == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['mutants']} mutants, {summary['killed']} killed, "
              f"{summary['equivalent']} equivalent, kill rate of the others "
              f"{summary['kill_rate_of_non_equivalent']:.3f}")  # fmt: skip
        for m in living:
            why = EQUIVALENT.get((m.rule, m.mutation))
            print(f"  survived: {m.rule}: {m.mutation}" + (f"  (equivalent: {why})" if why else ""))
        for rule, mutation in stale:
            print(f"  stale: {rule}: {mutation} is listed as equivalent but no longer survives")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
