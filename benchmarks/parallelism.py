"""FSDP2 against DDP, and bf16 against fp32, through `gpufleet run` on the same jobs.

    python benchmarks/parallelism.py [--rounds 3] [--quick]

Two comparisons, each a ratio of configurations measured in the same run, alternating in a
rotating order each round (a noisy shared machine slows all of them alike):

1. Step time and per-rank memory, FSDP / DDP: the synthetic MLP (256 -> 4 x 1024 -> 10, 3.2 M
   parameters, AdamW) on 2 workers, fp32. Memory is what rank 0 holds of parameters and
   optimizer state (FSDP: its shard; about 1/world of DDP's is expected).
2. Step time and final test accuracy, bf16 / fp32: the digits CNN, 300 steps on 2 workers,
   with DDP (bf16 autocast, fp32 weights and reduction) and FSDP (bf16 parameters in compute,
   fp32 reduction). Accuracy must stay within 0.5 points.

Step time is the median over rounds of the Trainer's own samples/s (boundary-to-boundary step
times, start-up excluded); checkpoints are off the timed path (one at the end). Writes
benchmarks/results/parallelism_<hardware>_<date>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, environment_section, median, result_path

MLP = {
    "name": "synthetic",
    "steps": 60,
    "batchSize": 64,
    "logEvery": 20,
    "inputSize": 256,
    "hiddenSize": 1024,
    "layers": 4,
    "samples": 8192,
}
DIGITS = {"name": "digits", "steps": 300, "batchSize": 32, "logEvery": 100}

CONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "mlp-ddp-fp32": (MLP, {"strategy": "ddp"}),
    "mlp-fsdp-fp32": (MLP, {"strategy": "fsdp"}),
    "digits-ddp-fp32": (DIGITS, {"strategy": "ddp"}),
    "digits-ddp-bf16": (DIGITS, {"strategy": "ddp", "mixedPrecision": "bf16"}),
    "digits-fsdp-fp32": (DIGITS, {"strategy": "fsdp"}),
    "digits-fsdp-bf16": (DIGITS, {"strategy": "fsdp", "mixedPrecision": "bf16"}),
}


def run(
    name: str, workload: dict[str, Any], parallelism: dict[str, Any], wd: Path
) -> dict[str, Any]:
    """One `gpufleet run --fresh` of the config; its JSON summary."""
    doc = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workload": workload,
            "procsPerNode": 2,
            "parallelism": parallelism,
            "checkpoint": {"everySteps": 100_000},
        },
    }
    spec = wd / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "run", str(spec), "--fresh", "-o", "json"],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(rounds: int, quick: bool) -> dict[str, list[dict[str, Any]]]:
    names = list(CONFIGS)
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                workload, parallelism = CONFIGS[name]
                if quick:
                    workload = {**workload, "steps": 20}
                s = run(name, workload, parallelism, Path(tmp))
                out[name].append(s)
                print(
                    f"round {r + 1} {name}: {s['samples_per_second']:.0f} samples/s "
                    f"accuracy {s['accuracy']}",
                    file=sys.stderr,
                )
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def sps(name: str) -> float:
        return median([s["samples_per_second"] for s in runs[name]])

    def held(name: str) -> float:
        extra = runs[name][0]["extra"]
        return float(extra["parameter_bytes"] + extra["optimizer_bytes"])

    def acc(name: str) -> float:
        return float(runs[name][0]["accuracy"])  # the same every round: deterministic

    return {
        "samples_per_second": {n: sps(n) for n in runs},
        "fsdp_over_ddp_step_time": sps("mlp-ddp-fp32") / sps("mlp-fsdp-fp32"),
        "fsdp_over_ddp_rank0_bytes": held("mlp-fsdp-fp32") / held("mlp-ddp-fp32"),
        "rank0_bytes": {n: held(n) for n in ("mlp-ddp-fp32", "mlp-fsdp-fp32")},
        "bf16_over_fp32_step_time": {
            "ddp": sps("digits-ddp-fp32") / sps("digits-ddp-bf16"),
            "fsdp": sps("digits-fsdp-fp32") / sps("digits-fsdp-bf16"),
        },
        "accuracy": {n: acc(n) for n in runs if n.startswith("digits")},
        "bf16_accuracy_delta_points": {
            s: 100 * (acc(f"digits-{s}-bf16") - acc(f"digits-{s}-fp32")) for s in ("ddp", "fsdp")
        },
        "digits_fsdp_over_ddp_step_time": sps("digits-ddp-fp32") / sps("digits-fsdp-fp32"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round of 20 steps; no file")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    runs = measure(rounds, args.quick)
    summary = summarize(runs)
    print(json.dumps(summary, indent=2))
    if args.quick:
        return
    env = environment()
    path = result_path("parallelism")
    path.with_suffix(".json").write_text(
        json.dumps(
            {
                "environment": env,
                "rounds": rounds,
                "configs": {n: {"workload": w, "parallelism": p} for n, (w, p) in CONFIGS.items()},
                "summary": summary,
            },
            indent=2,
        )
        + "\n"
    )
    sps = summary["samples_per_second"]
    lines = [
        "# FSDP2 vs DDP, bf16 vs fp32",
        "",
        f"`python benchmarks/parallelism.py --rounds {rounds}`: each config run {rounds} times "
        "through `gpufleet run` (2 workers, gloo), in rotating order; medians of the Trainer's "
        "samples/s (start-up excluded).",
        "",
        "| config | samples/s | final loss | test accuracy | rank-0 parameters + optimizer |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n in runs:
        extra = runs[n][0]["extra"]
        mem = (extra["parameter_bytes"] + extra["optimizer_bytes"]) / 2**20
        acc = runs[n][0]["accuracy"]
        loss = runs[n][0]["final_loss"]
        lines.append(
            f"| {n} | {sps[n]:,.0f} | {loss:.4f} | {'-' if acc is None else f'{acc:.4f}'} | "
            f"{mem:.2f} MiB |"
        )
    b = summary["bf16_over_fp32_step_time"]
    d = summary["bf16_accuracy_delta_points"]
    lines += [
        "",
        f"- FSDP / DDP step time (MLP, fp32): **{summary['fsdp_over_ddp_step_time']:.2f}**; "
        f"digits: {summary['digits_fsdp_over_ddp_step_time']:.2f}",
        f"- FSDP / DDP rank-0 parameter + optimizer bytes (MLP): "
        f"**{summary['fsdp_over_ddp_rank0_bytes']:.3f}** (1/world = 0.500)",
        f"- bf16 / fp32 step time (digits): DDP **{b['ddp']:.2f}**, FSDP **{b['fsdp']:.2f}**",
        f"- bf16 - fp32 test accuracy (digits, points): DDP **{d['ddp']:+.2f}**, FSDP "
        f"**{d['fsdp']:+.2f}** (bound: 0.5)",
        "",
        *environment_section(env),
    ]
    path.write_text("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
