"""The mutation score of the last `make mutation` (mutmut's own counts), per module and in all.

    python scripts/mutation_score.py [--record]

Reads mutants/mutmut-cicd-stats.json (`mutmut export-cicd-stats`) for the totals and
`mutmut results --all true` for each mutant's status. Score = killed / (killed + survived),
where a timeout counts as killed (the mutant made the tests hang) and a suspicious one as
survived. A survivor no test can tell from the original is listed in pyproject.toml's
`[tool.gpufleet.mutation-equivalent]` (its mutmut name = a line of its `mutmut show` diff,
`+` or `-` and the text, and why); the score leaves those out. --record writes
benchmarks/results/mutation_<date>.md with the survivors' names. Exit 1 below the goal
(GOAL %), for a survivor neither killed nor explained, and for an explanation whose mutant is
no longer that survivor (mutmut renumbers a function's mutants when it changes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tomllib
from collections import Counter
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATS = REPO / "mutants" / "mutmut-cicd-stats.json"
GOAL = 90.0
CAUGHT = {"killed", "timeout"}
MISSED = {"survived", "suspicious"}
EQUIVALENT = "equivalent"  # a survivor pyproject.toml explains


def mutmut(*args: str) -> str:
    """What `mutmut ARGS` prints, run in the repository."""
    program = Path(sys.executable).parent / "mutmut"
    return subprocess.run(
        [str(program), *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def equivalents() -> dict[str, dict[str, str]]:
    """pyproject's explained survivors: name -> {"mutation": changed line, "why": reason}."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(project["tool"]["gpufleet"].get("mutation-equivalent", {}))


def mutated_lines(name: str) -> list[str]:
    """The mutant's diff (`mutmut show NAME`): its `+` and `-` lines, each its sign and text."""
    diff = mutmut("show", name).splitlines()
    return [line[0] + line[1:].strip() for line in diff
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]  # fmt: skip


def stale(explained: dict[str, dict[str, str]], found: dict[str, str]) -> list[str]:
    """Explanations that no longer fit: the mutant is gone, was killed, or is another change."""
    wrong = []
    for name, entry in sorted(explained.items()):
        line = entry["mutation"].strip()
        if found.get(name) not in MISSED:
            wrong.append(f"{name}: {found.get(name, 'no such mutant')}, not a survivor")
        elif line[:1] + line[1:].strip() not in (shown := mutated_lines(name)):
            wrong.append(f"{name}: now changes {shown}, not {entry['mutation']!r}")
    return wrong


def statuses() -> dict[str, str]:
    """Each mutant's status, from `mutmut results --all true` (lines `name: status`)."""
    out = mutmut("results", "--all", "true")
    found = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            found[name] = status.strip()
    return found


def module_of(mutant: str) -> str:
    """`gpufleet.runtime.data` for `gpufleet.runtime.data.x_f__mutmut_3`."""
    return mutant.split(".x", 1)[0].split(".x_", 1)[0]


def score(counts: Counter[str]) -> tuple[float, int, int]:
    caught = sum(counts[s] for s in CAUGHT)
    judged = caught + sum(counts[s] for s in MISSED)
    return (100.0 * caught / judged if judged else 100.0), caught, judged


def report(found: dict[str, str]) -> list[str]:
    by_module: dict[str, Counter[str]] = {}
    for name, status in found.items():
        by_module.setdefault(module_of(name), Counter())[status] += 1
    lines = ["| module | killed | survived | equivalent | no tests | score |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    total: Counter[str] = Counter()
    for module in sorted(by_module):
        counts = by_module[module]
        total += counts
        pct, caught, judged = score(counts)
        lines.append(f"| {module} | {caught} | {judged - caught} | {counts[EQUIVALENT]} | "
                     f"{counts['no tests']} | {pct:.1f} % |")  # fmt: skip
    pct, caught, judged = score(total)
    lines.append(f"| **all** | {caught} | {judged - caught} | {total[EQUIVALENT]} | "
                 f"{total['no tests']} | **{pct:.1f} %** |")  # fmt: skip
    return lines


def setting() -> str:
    """Where and on what the score was measured: commit, versions, machine."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("mutmut", "torch", "pytest"))
    return (f"Commit {commit or '?'}; Python {platform.python_version()}, {versions}; "
            f"{platform.machine()} {platform.processor() or ''} with {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.release()}; pyproject.toml's [tool.mutmut]."
            )  # fmt: skip


def record(lines: list[str], totals: object, survivors: list[str], explained: list[str]) -> None:
    name = f"mutation_cpu-{os.cpu_count()}core_{dt.date.today().isoformat()}.md"
    out = REPO / "benchmarks" / "results" / name
    body = ["# Mutation score (make mutation, mutmut)", "", setting(), "", *lines, "",
            f"mutmut's totals: `{json.dumps(totals)}`", "", "Survivors not explained:", "",
            *([f"- `{n}`" for n in survivors] or ["none"]), "", "Equivalent (pyproject.toml's "
            "[tool.gpufleet.mutation-equivalent]):", "", *[f"- `{n}`" for n in explained],
            ""]  # fmt: skip
    out.write_text("\n".join(body))
    print(f"recorded in {out.relative_to(REPO)}")


def main(argv: list[str]) -> int:
    if not STATS.is_file():
        print(f"no {STATS.relative_to(REPO)}: run `make mutation` first", file=sys.stderr)
        return 2
    totals = json.loads(STATS.read_text())
    found = statuses()
    explained = equivalents()
    wrong = stale(explained, found)
    fitting = sorted(set(explained) - {w.split(":", 1)[0] for w in wrong})
    found.update(dict.fromkeys(fitting, EQUIVALENT))
    lines = report(found)
    survivors = sorted(n for n, s in found.items() if s in MISSED)
    print("\n".join(lines))
    print(f"mutmut's totals: {json.dumps(totals)}")
    if survivors:
        print("survived, not explained: " + ", ".join(survivors))
    for line in wrong:
        print(f"stale explanation in pyproject.toml: {line}")
    if "--record" in argv:
        record(lines, totals, survivors, fitting)
    pct, _, _ = score(Counter(found.values()))
    return 0 if pct >= GOAL and not survivors and not wrong else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
