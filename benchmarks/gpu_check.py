"""The result of scripts/gpu-check.sh on a lent GPU machine: each step (the `gpu` tests, the GPU
benchmarks) with its exit code, time and last lines, and the machine's facts (nvidia-smi's GPU,
driver and memory, the device's torch and CUDA, the Python).

    python -m benchmarks.gpu_check STEPS.jsonl [--dest DIR]

STEPS.jsonl: one JSON object a step, as gpu-check.sh appends them: name, command, exit code,
seconds, the output's tail. Writes gpu-check_<hardware>_<date>.md and .json (to DIR, default
benchmarks/results/); exits 1 if a step failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, environment, hardware

NVIDIA_SMI = ("name", "driver_version", "memory.total", "compute_cap")


def machine() -> dict[str, str]:
    """environment()'s facts, with the GPU as nvidia-smi reports it and torch's CUDA."""
    import torch

    facts = environment()
    facts["cuda (torch)"] = str(torch.version.cuda)
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI)}",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30, check=False)  # fmt: skip
        gpus = smi.stdout.strip() if smi.returncode == 0 else f"nvidia-smi: {smi.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        gpus = f"nvidia-smi: {exc}"
    facts["nvidia-smi (" + ", ".join(NVIDIA_SMI) + ")"] = gpus or "no GPU listed"
    return facts


def report(steps: list[dict[str, Any]], facts: dict[str, str]) -> str:
    """The results page: a table of the steps, each failed step's last lines, the facts."""
    lines = ["# GPU checks (scripts/gpu-check.sh)", "",
             "| step | result | seconds | command |", "| --- | --- | --- | --- |"]  # fmt: skip
    for s in steps:
        result = "passed" if s["exit"] == 0 else f"FAILED (exit {s['exit']})"
        lines.append(f"| {s['name']} | {result} | {s['seconds']:.0f} | `{s['command']}` |")
    for s in (s for s in steps if s["exit"] != 0):
        lines += ["", f"## {s['name']}: last lines", "", "```text", s["tail"].rstrip(), "```"]
    lines += ["", "## Environment", "", *[f"- {k}: {v}" for k, v in facts.items()], ""]
    return "\n".join(lines)


def write(steps: list[dict[str, Any]], facts: dict[str, str], dest: Path, tag: str) -> Path:
    """gpu-check_<tag>_<date>.md and .json in ``dest``; returns the .md."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"gpu-check_{tag}_{facts['date']}.md"
    path.write_text(report(steps, facts))
    data = {"steps": steps, "environment": facts}
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=Path)
    parser.add_argument("--dest", type=Path, default=RESULTS)
    args = parser.parse_args()
    steps = [json.loads(line) for line in args.steps.read_text().splitlines() if line.strip()]
    path = write(steps, machine(), args.dest, hardware())
    print(path)
    return 0 if steps and all(s["exit"] == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
