"""What measuring coverage costs: the same tests run plainly and under coverage.py (the way
`make test` runs them: `coverage run -m pytest`, every process the tests start measured by
pyproject's `patch = subprocess`), alternating in one run.

    python benchmarks/coverage_overhead.py [--rounds 3] [TEST ...]

Reports wall time and CPU (this process's children: pytest and every process below it) per
configuration, and the ratios covered / plain. Writes benchmarks/results/coverage-overhead_
<hardware>_<date>.md (and .json beside it). docs/coverage.md uses the ratios to size the scope
`make test` measures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, environment_section, median, result_path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# A local run of two nodes (agents, forkserver workers), a pod launcher's job, and unit tests of
# the spec and the checkpoints (in the pytest process itself).
TESTS = [
    "tests/integration/test_local_run.py::test_two_local_nodes_match_one_node_of_two",
    "tests/integration/test_pod_launcher.py::test_pod_serves_job_metrics_and_exits_0",
    "tests/unit/test_spec.py",
    "tests/unit/test_checkpoint.py",
]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(tests: list[str], covered: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one pytest run of `tests`, plain or under coverage."""
    pytest = ["-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    with tempfile.TemporaryDirectory() as data:
        if covered:
            command = [str(BIN / "coverage"), "run", *pytest]
            env["COVERAGE_FILE"] = f"{data}/cov"
        else:
            command = [sys.executable, *pytest]
        cpu, start = children_cpu(), time.perf_counter()
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode != 0:
        sys.exit(f"{'covered' if covered else 'plain'} run failed:\n{done.stdout[-2000:]}")
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("tests", nargs="*", default=TESTS)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "covered": []}
    for r in range(args.rounds):
        for covered in (r % 2 == 1, r % 2 == 0):  # alternate which goes first
            kind = "covered" if covered else "plain"
            runs[kind].append(one_run(args.tests, covered))
            print(f"round {r + 1}: {kind} wall, CPU {runs[kind][-1]}", flush=True)
    wall = {k: median([w for w, _ in v]) for k, v in runs.items()}
    cpu = {k: median([c for _, c in v]) for k, v in runs.items()}
    result = {
        "tests": args.tests,
        "rounds": args.rounds,
        "runs": runs,
        "median_wall_s": wall,
        "median_cpu_s": cpu,
        "wall_ratio": wall["covered"] / wall["plain"],
        "cpu_ratio": cpu["covered"] / cpu["plain"],
        "environment": environment(),
    }
    write(result)
    return 0


def write(result: dict) -> None:
    out = result_path("coverage-overhead")
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    wall, cpu = result["median_wall_s"], result["median_cpu_s"]
    lines = [
        "# What measuring coverage costs (plain pytest against `coverage run -m pytest`)",
        "",
        f"Tests ({result['rounds']} rounds each, alternating, one pytest process, `-n 0`):",
        "",
        *[f"- `{t}`" for t in result["tests"]],
        "",
        "| run | wall (median) | CPU (median) |",
        "|---|---:|---:|",
        f"| plain | {wall['plain']:.1f} s | {cpu['plain']:.1f} s |",
        f"| covered | {wall['covered']:.1f} s | {cpu['covered']:.1f} s |",
        f"| ratio | **{result['wall_ratio']:.2f}** | **{result['cpu_ratio']:.2f}** |",
        "",
        *environment_section(result["environment"]),
    ]
    out.write_text("\n".join(lines))
    print(out.read_text())


if __name__ == "__main__":
    sys.exit(main())
