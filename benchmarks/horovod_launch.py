"""What running a Horovod script under gpufleet costs against Horovod's own launcher, and what
gpufleet's default of no tensor fusion costs against Horovod's, on the same script in the same
run.

    python benchmarks/horovod_launch.py [--rounds 3] [--epochs 12]

Each round runs examples/horovod_digits.py on 2 processes of this machine three ways, in a
rotating order: `horovodrun -np 2 -H localhost:2 --gloo` with fusion off
(HOROVOD_FUSION_THRESHOLD=0, gpufleet's default: the baseline), the same with Horovod's default
fusion (128 MiB), and `gpufleet run` of a 1-node, 2-process spec.framework horovod job (the
elastic agent, the worker shim's Gloo rendezvous). Wall is from the launcher's start to its
exit; CPU is the whole machine's busy time from /proc/stat over the run (run it on an otherwise
quiet machine); "training s" is rank 0's time from its first to its last epoch line. Writes
benchmarks/results/horovod-launch_<hardware>_<date>.md (and .json).
"""

from __future__ import annotations

import argparse
import importlib.metadata
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
from common import environment, machine_busy, median, write_results

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "horovod_digits.py"
HOROVODRUN = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", "-H", "localhost:2",
              "--gloo", sys.executable, "-u"]  # fmt: skip
MODES = ["horovodrun, fusion off", "horovodrun, Horovod's fusion", "gpufleet run"]


def command(mode: str, tmp: Path, args: list[str]) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    if mode == "gpufleet run":
        doc = {"apiVersion": "gpufleet.dev/v1alpha1", "kind": "TrainingJob",
               "metadata": {"name": "hvd-bench"},
               "spec": {"framework": "horovod", "command": [str(SCRIPT), *args],
                        "nodes": 1, "procsPerNode": 2, "maxRestarts": 0}}  # fmt: skip
        (tmp / "job.yaml").write_text(yaml.safe_dump(doc))
        return [sys.executable, "-m", "gpufleet.cli.main", "run", "job.yaml"], env
    if mode == "horovodrun, fusion off":
        env["HOROVOD_FUSION_THRESHOLD"] = "0"
    return [*HOROVODRUN, str(SCRIPT), *args], env


def trial(mode: str, epochs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--epochs", str(epochs), "--checkpoint-dir", f"{tmp}/ckpt", "--out",
                f"{tmp}/result.json"]  # fmt: skip
        argv, env = command(mode, Path(tmp), args)
        busy, started = machine_busy(), time.monotonic()
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        epochs_at = []
        for line in proc.stdout or []:
            if "epoch " in line and ": loss " in line:
                epochs_at.append(time.monotonic())
        code = proc.wait(timeout=600)
        wall, cpu = time.monotonic() - started, machine_busy() - busy
        if code != 0:
            raise SystemExit(f"{mode}: exited {code}")
        result = json.loads((Path(tmp) / "result.json").read_text())
    # from the end of the first epoch to the end of the last: the epochs' own pace
    training = epochs_at[-1] - epochs_at[0] if len(epochs_at) > 1 else float("nan")
    return {"wall": wall, "cpu": cpu, "training": training, "digest": result["digest"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
            runs[mode].append(trial(mode, args.epochs))
            print(mode, runs[mode][-1], flush=True)
    write(runs, args.rounds, args.epochs)


def write(runs: dict[str, list[dict[str, Any]]], rounds: int, epochs: int) -> None:
    env = environment()
    env["horovod"] = f"{importlib.metadata.version('horovod')} (scripts/build-horovod.sh, Gloo)"
    how = __doc__.split("\n\n")[2]
    base = {k: median([t[k] for t in runs[MODES[0]]]) for k in ("wall", "cpu", "training")}
    digests = {t["digest"] for ts in runs.values() for t in ts}
    lines = ["# A Horovod script under gpufleet against horovodrun, and fusion off against on", "",
             f"`python benchmarks/horovod_launch.py --rounds {rounds} --epochs {epochs}`. "
             f"{how}", "",
             "| launcher | wall s (median) | wall ratio | busy CPU-s (median) | CPU ratio "
             "| training s (median) | training ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for mode, ts in runs.items():
        m = {k: median([t[k] for t in ts]) for k in ("wall", "cpu", "training")}
        lines.append(f"| {mode} | {m['wall']:.1f} | {m['wall'] / base['wall']:.2f} | "
                     f"{m['cpu']:.1f} | {m['cpu'] / base['cpu']:.2f} | {m['training']:.2f} | "
                     f"{m['training'] / base['training']:.2f} |")  # fmt: skip
    same = "yes" if len(digests) == 1 else f"NO ({len(digests)} digests)"
    lines += ["", f"Every run ended with the same weights (sha256 over the state dict): {same}.",
              ""]  # fmt: skip
    write_results("horovod-launch", lines, env, runs)


if __name__ == "__main__":
    main()
