"""Failures on real pods, measured (issue 29): the real-node chaos tests run several times in a
row (each run its own real-node cluster, up and down), every run's pass or failure and the
numbers each test records ($GPUFLEET_RECORD: tests/support/realnodes.record), summarised per
case beside the local chaos matrix (benchmarks/chaos.py).

Needs root, the built components (make controlplane), helm (make tools) and the image (make
image). Writes benchmarks/results/cluster-chaos_<hardware>_<date>.{json,md}.

    python benchmarks/cluster_chaos.py [--runs 3] [-k EXPRESSION] [--theme NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import environment, environment_section, result_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' package, for the names the tests read
from tests.support.realnodes import CHAOS_FULL  # noqa: E402

TESTS = [
    f"tests/cluster/test_realnodes_{case}.py"
    for case in ("nodeloss", "preemption", "partition", "autoscaling", "device", "elastic")
]
# What each recorded number is, for the report (in the order shown).
MEANING = {
    "evicted_to_pods_gone_s": "Kueue's eviction (the Workload's Evicted condition) to the "
                              "job's pods gone (s)",
    "readmitted_to_resumed_s": "admitted again (Admitted condition) to the resumed rank 0's "
                               "'resumed from step' line (kubelet's timestamp) (s)",
    "steps_lost": "steps lost: preempted-at step minus resumed-from step",
    "preempted_at_step": "the step of the checkpoint taken at SIGTERM",
    "free_restarts": "JobSet restarts that cost nothing of maxRestarts (status.restarts)",
    "kill_to_survivor_exit_s": "node killed to the surviving pod's exit (75) (s)",
    "kill_to_not_ready_s": "node killed to the Node NotReady (s)",
    "kill_to_evicted_s": "node killed to the lost pod evicted (DisruptionTarget) (s)",
    "kill_to_first_step_s": "node killed to a step after the resume logged by rank 0 (s)",
    "hang_timeout_s": "the job's spec.hangTimeout (s)",
    "cut_to_detected_s": "partition to the first hang watchdog's line (kubelet's timestamp) (s)",
    "watchdog_idle_s": "the watchdogs' own time without a step when they fired (s)",
    "cut_to_heal_s": "partition to heal (s)",
    "heal_to_status_said_s": "heal to `gpufleet status` telling the restart and resume (s)",
    "load_to_second_ready_s": "LoadGen's pod created to the second Triton replica Ready (s)",
    "load_end_to_one_replica_s": "load stopped to one replica left (scaleDownDelay 30 s) (s)",
    "runs": "LoadGen Offline runs, none with a failed request",
    "freed_to_first_step_at_2_s": "elastic: the other job cancelled (quota freed) to the "
                                  "resume at 2 workers logged (kubelet's timestamp) (s)",
    "reclaim_to_first_step_at_1_s": "elastic: the lender's job submitted (reclaim) to the "
                                    "resume at 1 worker logged (s)",
    "fault_to_alert_s": "rank 1's lost GPU (its log's fault line) to GpufleetGpuXidHardware "
                        "firing in Prometheus, naming the node and GPU (s)",
}  # fmt: skip


def run_once(record: Path, select: str | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
            "-m", "realnodes", *TESTS, *(["-k", select] if select else [])]  # fmt: skip
    env = {**os.environ, "GPUFLEET_RECORD": str(record), CHAOS_FULL: "1"}
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    return {"rc": done.returncode, "summary": tail[0], "wall_s": time.monotonic() - started,
            "output_tail": done.stdout[-4000:] if done.returncode else ""}  # fmt: skip


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    cases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in records:
        for key, value in row.items():
            if key != "case":
                cases[row["case"]][key].append(value)
    return {case: dict(numbers) for case, numbers in cases.items()}


def report(runs: list[dict[str, Any]], cases: dict[str, Any], env: dict[str, str],
           out: Path, select: str | None) -> None:  # fmt: skip
    lines = ["# Failures on real pods (issue 29): the real-node chaos tests, run after run", "",
             f"`python benchmarks/cluster_chaos.py --runs {len(runs)}`: "
             f"`pytest -m realnodes {' '.join(TESTS)}`"
             f"{f' -k {select!r}' if select else ''} {len(runs)} times in a row, each with "
             "its own real-node cluster (2 nodes x 4 \"A30\" that are the CPU, Kueue with the "
             "chart's lab values), nothing else running.", "",
             "| run | result | wall |", "| --- | --- | ---: |"]  # fmt: skip
    lines += [f"| {i} | {r['summary']} | {r['wall_s']:.0f} s |" for i, r in enumerate(runs, 1)]
    for case, numbers in sorted(cases.items()):
        lines += ["", f"## {case}", "", "| measure | per run | min | max |",
                  "| --- | --- | ---: | ---: |"]  # fmt: skip
        for key in [k for k in MEANING if k in numbers]:
            xs = numbers[key]
            shown = ", ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in xs)
            lines.append(f"| {MEANING[key]} | {shown} | {min(xs):.1f} | {max(xs):.1f} |")
    lines += ["", *environment_section(env)]
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"env": env, "runs": runs, "cases": cases}, indent=2) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-k", dest="select", help="pytest's -k, to run some of the cases")
    parser.add_argument(
        "--theme", default="cluster-chaos", help="the results file's first word (some cases)"
    )
    args = parser.parse_args()
    runs, records = [], []
    with tempfile.TemporaryDirectory(prefix="gf-cluster-chaos-") as tmp:
        record = Path(tmp) / "record.jsonl"
        for i in range(args.runs):
            runs.append(run_once(record, args.select))
            print(f"run {i + 1}: {runs[-1]['summary']} ({runs[-1]['wall_s']:.0f} s)", flush=True)
        if record.exists():
            records = [json.loads(line) for line in record.read_text().splitlines()]
    out = result_path(args.theme)
    report(runs, summarise(records), environment(), out, args.select)
    print(out.read_text())
    sys.exit(0 if all(r["rc"] == 0 for r in runs) else 1)


if __name__ == "__main__":
    main()
