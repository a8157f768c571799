"""What starting the workers costs: forked from a forkserver that imported torch once (what
gpufleet does, gpufleet.launch.forked) against each worker a new Python (torchelastic's
default for a command, what gpufleet did before), and against the same forkserver that freezes
nothing for the garbage collector (gpufleet.launch.zygote.preloaded), on the same job in the
same run.

    python benchmarks/worker_start.py [--rounds 3]

Each round runs the digits job (1 node x 2 processes, 40 steps, a checkpoint every 10) with
`gpufleet run`, in each way, in a rotating order: once uninterrupted, and once with rank 0
killed at step 17 (one restart of the group). The baseline is the same `gpufleet run` with the
node agent's entry point switched back to the worker command; "nothing frozen" is `gpufleet run`
with gc.freeze made a no-op (both patches of this script only).
CPU is the whole machine's busy time from /proc/stat over the run (the forkserver and its
workers are nobody's waited-for children, so a process's own rusage misses them): run it on an
otherwise quiet machine. The ranks' CPU is their own, from the kernel's process accounting
(as root; not while benchmarks/suite_cpu.py runs, which uses the same accounting). Writes
benchmarks/results/worker-start_<hardware>_<date>.md (and .json).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' job and helpers
from common import environment, machine_busy, median, write_results
from suite_cpu import read_records
from tests.support.specs import digits_job

WORKLOAD = {"name": "digits", "steps": 40, "batchSize": 32, "logEvery": 10}
SPEC = digits_job("start", workload=WORKLOAD)
# The baseline: gpufleet run, its agent given the worker command as torchelastic would start it.
AS_COMMAND = (
    "import sys, gpufleet.launch.node as n;"
    "n.entrypoint = lambda argv, **_: (argv[0], argv[1:], None);"
    "from gpufleet.cli.main import main; sys.argv[0] = 'gpufleet'; sys.exit(main())"
)
NOT_FROZEN = (
    "import gc, sys; gc.freeze = lambda: None;"
    "from gpufleet.cli.main import main; sys.argv[0] = 'gpufleet'; sys.exit(main())"
)
MODES = {"forked": ["-m", "gpufleet.cli.main"], "forked, nothing frozen": ["-c", NOT_FROZEN],
         "a new Python each": ["-c", AS_COMMAND]}  # fmt: skip
SCENARIOS = {"uninterrupted": "", "killed at step 17": "kill@step=17,rank=0"}
Runs = dict[str, dict[str, list[dict[str, Any]]]]  # scenario -> mode -> trials
# The kernel's process accounting (acct(2), as benchmarks/suite_cpu.py uses it): the CPU of the
# forked workers (process name gpufleet-rank<N>), whom no process reaps and waits for.
LIBC = ctypes.CDLL(None, use_errno=True)


def trial(mode: str, faults: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "job.yaml"
        spec.write_text(yaml.safe_dump(SPEC))
        env = dict(os.environ, GPUFLEET_FAULTS=faults) if faults else dict(os.environ)
        pacct = Path(tmp) / "pacct"
        pacct.write_bytes(b"")
        accounting = LIBC.acct(str(pacct).encode()) == 0  # root only
        busy, started = machine_busy(), time.monotonic()
        argv = [sys.executable, *MODES[mode], "run", str(spec), "-o", "json"]
        proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        wall, cpu = time.monotonic() - started, machine_busy() - busy
        time.sleep(1)  # the forkserver's exit, after the run's
        if accounting:
            LIBC.acct(None)
        ranks = sum(r[4] for r in read_records(pacct) if r[5].startswith("gpufleet-rank"))
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: gpufleet run exited {proc.returncode}: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    return {"wall": wall, "cpu": cpu, "restarts": summary["restarts"],
            "ranks_cpu": ranks if accounting else None,
            "digest": summary["state_digest"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: Runs = {s: {m: [] for m in MODES} for s in SCENARIOS}
    modes = list(MODES)
    for r in range(args.rounds):
        for scenario, faults in SCENARIOS.items():
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                runs[scenario][mode].append(trial(mode, faults))
                print(scenario, mode, runs[scenario][mode][-1], flush=True)
    write(runs, args.rounds)


def write(runs: Runs, rounds: int) -> None:
    env = environment()
    how = __doc__.split("\n\n")[2]
    lines = ["# Starting the workers: forked from a forkserver, or a new Python each", "",
             f"`python benchmarks/worker_start.py --rounds {rounds}`. {how}", "",
             "| scenario | workers | wall s (median) | busy CPU-s (median) | CPU ratio"
             " | the ranks' CPU-s (median) | restarts | same weights |",
             "|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for scenario, by_mode in runs.items():
        base = median([t["cpu"] for t in by_mode["a new Python each"]])
        digests = {t["digest"] for ts in by_mode.values() for t in ts}
        for mode, ts in by_mode.items():
            cpu = median([t["cpu"] for t in ts])
            ranks = [t["ranks_cpu"] for t in ts if t.get("ranks_cpu") is not None]
            lines.append(f"| {scenario} | {mode} | {median([t['wall'] for t in ts]):.1f} | "
                         f"{cpu:.1f} | {cpu / base:.2f} | "
                         f"{f'{median(ranks):.2f}' if ranks else 'n/a'} | {ts[0]['restarts']} | "
                         f"{'yes' if len(digests) == 1 else 'NO'} |")  # fmt: skip
    lines += [""]
    write_results("worker-start", lines, env, runs)


if __name__ == "__main__":
    main()
