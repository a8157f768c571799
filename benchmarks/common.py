"""Helpers shared by benchmark scripts: environment facts and result files."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

import gpufleet

RESULTS = Path(__file__).resolve().parent / "results"


def hardware() -> str:
    """A short hardware tag for result file names: 'cpu-2core' or 'h100-x1'."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower().replace("nvidia ", "").split()[0]
        return f"{name}-x{torch.cuda.device_count()}"
    return f"cpu-{os.cpu_count()}core"


def environment() -> dict[str, str]:
    """Versions and machine facts to record next to every result."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": dt.date.today().isoformat(),
        "gpufleet": gpufleet.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpu": f"{cpu} ({os.cpu_count()} cores)",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "os": platform.platform(),
    }


def machine_busy() -> float:
    """CPU-seconds the whole machine has been busy so far (every core; all but idle and iowait),
    from /proc/stat: what a run costs counting the processes nobody waits for."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def median(xs: list[float]) -> float:
    """Median of a non-empty list."""
    return statistics.median(xs)


def result_path(theme: str) -> Path:
    """benchmarks/results/<theme>_<hardware>_<date>.md"""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{theme}_{hardware()}_{dt.date.today().isoformat()}.md"


def write_results(theme: str, lines: list[str], env: dict[str, str], runs: object) -> Path:
    """``result_path(theme)`` with ``lines`` and the environment section, and beside it the
    .json of the runs; prints and returns the .md's path."""
    out = result_path(theme)
    out.write_text("\n".join([*lines, *environment_section(env)]) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"env": env, "runs": runs}, indent=1) + "\n")
    print(out)
    return out


def environment_section(env: dict[str, str]) -> list[str]:
    """The "## Environment" section of a results .md, one line per fact."""
    return ["## Environment", "", *[f"- {k}: {v}" for k, v in env.items()], ""]
