"""The mutation score of the last `make mutation` (mutmut's own counts), per module and in all.

    python scripts/mutation_score.py [--record]

Reads mutants/mutmut-cicd-stats.json (`mutmut export-cicd-stats`) for the totals and
`mutmut results --all true` for each mutant's status. Score = killed / (killed + survived),
where a timeout counts as killed (the mutant made the tests hang) and a suspicious one as
survived. --record writes benchmarks/results/mutation_<date>.md with the survivors' names.
Exit 1 below the goal (GOAL %).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATS = REPO / "mutants" / "mutmut-cicd-stats.json"
GOAL = 90.0
CAUGHT = {"killed", "timeout"}
MISSED = {"survived", "suspicious"}


def statuses() -> dict[str, str]:
    """Each mutant's status, from `mutmut results --all true` (lines `name: status`)."""
    mutmut = Path(sys.executable).parent / "mutmut"
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"], cwd=REPO, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
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
    lines = ["| module | killed | survived | no tests | score |", "|---|---:|---:|---:|---:|"]
    total: Counter[str] = Counter()
    for module in sorted(by_module):
        counts = by_module[module]
        total += counts
        pct, caught, judged = score(counts)
        lines.append(f"| {module} | {caught} | {judged - caught} | {counts['no tests']} | "
                     f"{pct:.1f} % |")  # fmt: skip
    pct, caught, judged = score(total)
    lines.append(f"| **all** | {caught} | {judged - caught} | {total['no tests']} | "
                 f"**{pct:.1f} %** |")  # fmt: skip
    return lines


def main(argv: list[str]) -> int:
    if not STATS.is_file():
        print(f"no {STATS.relative_to(REPO)}: run `make mutation` first", file=sys.stderr)
        return 2
    totals = json.loads(STATS.read_text())
    found = statuses()
    lines = report(found)
    survivors = sorted(n for n, s in found.items() if s in MISSED)
    print("\n".join(lines))
    print(f"mutmut's totals: {json.dumps(totals)}")
    if survivors:
        print("survived: " + ", ".join(survivors))
    if "--record" in argv:
        out = REPO / "benchmarks" / "results" / f"mutation_{dt.date.today().isoformat()}.md"
        body = ["# Mutation score (make mutation, mutmut)", "", *lines, "",
                f"mutmut's totals: `{json.dumps(totals)}`", "", "Survivors:", "",
                *[f"- `{n}`" for n in survivors], ""]  # fmt: skip
        out.write_text("\n".join(body))
        print(f"recorded in {out.relative_to(REPO)}")
    pct, _, _ = score(Counter(found.values()))
    return 0 if pct >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
