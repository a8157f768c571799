"""Exact across world sizes against plain DDP, at 1, 2 and 4 workers, through `gpufleet run`.

    python benchmarks/exact_modes.py [--rounds 3] [--quick]

The synthetic MLP (256 -> 2 x 512 -> 10, AdamW), a global batch of 64 samples in 4 shards, 40
steps. Each world size runs both modes each round, in rotating order (a noisy shared machine
slows all of them alike). Per world size:

- step time, exact / DDP: the median over rounds of the Trainer's own samples/s (start-up
  excluded; one checkpoint, at the end);
- bytes per step each rank sends and receives for the gradients: exact mode's all-gathers as
  its reducer counted them, DDP's ring all-reduce as 2 x 2(W - 1)/W x the gradient bytes (the
  ring's own count: gloo's algorithm may differ, the order of magnitude does not);
- the gradient copies exact mode's tree held at most, beside the model's own gradients;
- the final state_digest of each: exact mode's must be one across world sizes.

Writes benchmarks/results/exact-modes_<hardware>_<date>.md and .json.
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

GLOBAL_BATCH, SHARDS = 64, 4
MLP: dict[str, Any] = {"name": "synthetic", "steps": 40, "logEvery": 20, "inputSize": 256,
                       "hiddenSize": 512, "layers": 2, "samples": 4096}  # fmt: skip
WORLDS = (1, 2, 4)
MODES = {"ddp": {"strategy": "ddp"},
         "exact": {"strategy": "ddp", "exactAcrossWorldSizes": True, "shards": SHARDS}}  # fmt: skip


def run(mode: str, world: int, wd: Path, steps: int) -> dict[str, Any]:
    """One `gpufleet run --fresh` of ``mode`` at ``world`` workers; its JSON summary."""
    name = f"{mode}-{world}"
    doc = {"apiVersion": "gpufleet.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": name},
           "spec": {"workload": {**MLP, "steps": steps, "batchSize": GLOBAL_BATCH // world},
                    "procsPerNode": world, "parallelism": MODES[mode],
                    "checkpoint": {"everySteps": 100_000}}}  # fmt: skip
    spec = wd / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "run", str(spec), "--fresh", "-o", "json"],
        cwd=wd, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(rounds: int, steps: int) -> dict[str, list[dict[str, Any]]]:
    names = [(m, w) for w in WORLDS for m in MODES]
    out: dict[str, list[dict[str, Any]]] = {f"{m}-{w}": [] for m, w in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for mode, world in names[r % len(names) :] + names[: r % len(names)]:
                s = run(mode, world, Path(tmp), steps)
                out[f"{mode}-{world}"].append(s)
                print(f"round {r + 1} {mode}-{world}: {s['samples_per_second']:.0f} samples/s",
                      file=sys.stderr)  # fmt: skip
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def sps(name: str) -> float:
        return median([s["samples_per_second"] for s in runs[name]])

    grads = runs["ddp-1"][0]["extra"]["parameter_bytes"]  # DDP: one gradient per parameter
    rows = {}
    for w in WORLDS:
        extra = runs[f"exact-{w}"][0]["extra"]
        rows[w] = {
            "samples_per_second": {"ddp": sps(f"ddp-{w}"), "exact": sps(f"exact-{w}")},
            "exact_over_ddp_step_time": sps(f"ddp-{w}") / sps(f"exact-{w}"),
            "bytes_per_step": {"ddp_ring": 4 * (w - 1) / w * grads,
                               "exact_measured": extra["exact_bytes_moved_per_step"]},
            "exact_tree_bytes": extra["exact_tree_bytes"],
            "digest": {m: runs[f"{m}-{w}"][0]["state_digest"] for m in MODES},
        }  # fmt: skip
    digests = {m: {rows[w]["digest"][m] for w in WORLDS} for m in MODES}
    return {"gradient_bytes": grads, "worlds": rows,
            "distinct_digests": {m: len(d) for m, d in digests.items()}}  # fmt: skip


def write(summary: dict[str, Any], rounds: int) -> None:
    env = environment()
    path = result_path("exact-modes")
    data = {"environment": env, "rounds": rounds, "workload": MLP, "global_batch": GLOBAL_BATCH,
            "shards": SHARDS, "summary": summary}  # fmt: skip
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    mib = 2**20
    lines = [
        "# Exact across world sizes vs plain DDP",
        "",
        f"`python benchmarks/exact_modes.py --rounds {rounds}`: the synthetic MLP "
        f"(256 -> 2 x 512 -> 10, {summary['gradient_bytes'] / mib:.2f} MiB of gradients), a "
        f"global batch of {GLOBAL_BATCH} in {SHARDS} shards, {MLP['steps']} steps, gloo; each "
        "world size runs both modes each round in rotating order; medians of the Trainer's "
        "samples/s. On CPU exact mode computes on one thread per worker, DDP on its share of "
        "the cores: the time ratio includes that.",
        "",
        "| workers | DDP samples/s | exact samples/s | exact / DDP step time | bytes/step DDP "
        "(ring) | bytes/step exact (measured) | exact's tree |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for w, row in summary["worlds"].items():
        b = row["bytes_per_step"]
        lines.append(
            f"| {w} | {row['samples_per_second']['ddp']:,.0f} | "
            f"{row['samples_per_second']['exact']:,.0f} | **{row['exact_over_ddp_step_time']:.2f}**"
            f" | {b['ddp_ring'] / mib:.2f} MiB | {b['exact_measured'] / mib:.2f} MiB | "
            f"{row['exact_tree_bytes'] / mib:.2f} MiB |"
        )
    d = summary["distinct_digests"]
    lines += [
        "",
        f"- distinct final state_digests over 1, 2 and 4 workers: exact **{d['exact']}**, "
        f"DDP {d['ddp']}",
        "",
        *environment_section(env),
    ]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round of 8 steps; no file")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    summary = summarize(measure(rounds, 8 if args.quick else int(MLP["steps"])))
    print(json.dumps(summary, indent=2))
    if not args.quick:
        write(summary, rounds)


if __name__ == "__main__":
    main()
