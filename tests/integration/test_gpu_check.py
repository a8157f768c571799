"""scripts/gpu-check.sh's dry parts, here where no GPU is (the run itself is for a lent GPU
machine): what scripts/gpu-prep.sh carries (gpufleet and the packages the device lacks, for its
Python 3.12, within the device tool's 64 MiB a call, PyTriton's wheel in two parts that join
back whole), the refusal on a machine without a GPU, and the result writer
(benchmarks/gpu_check.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.gpu_check import machine, write

from tests.support.paths import REPO

CHECK = REPO / "scripts" / "gpu-check.sh"
LIMIT = 64 << 20  # the device tool's working tree and carry, a call
DEVICE_LACKS = {"gpufleet", "pydantic", "pydantic_core", "annotated_types", "typing_inspection",
                "tritonclient", "python_rapidjson", "mlcommons_loadgen", "mlperf_logging",
                "pyzmq", "sh"}  # fmt: skip


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/gpu-prep.sh's output (its downloads from PyPI, pip's cache after the first)."""
    dest = tmp_path_factory.mktemp("carry") / "gpu-carry"
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu-prep.sh"), str(dest)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "call 1: carry" in done.stdout and "call 2" in done.stdout, done.stdout
    return dest


def tree_bytes() -> int:
    listed = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listed, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sum((REPO / f).stat().st_size for f in files.split() if (REPO / f).is_file())


@pytest.mark.slow
def test_the_carry_is_what_the_device_lacks_for_its_python_within_each_calls_limit(
    carry: Path,
) -> None:
    wheels = sorted((carry / "wheels").glob("*.whl"))
    names = [w.name.split("-")[0].lower() for w in wheels]
    assert set(names) == DEVICE_LACKS and len(names) == len(set(names)), names
    for w in wheels:  # pure Python, or CPython 3.12's on x86-64 Linux
        tags = w.name.removesuffix(".whl").split("-")[-3:]
        assert tags[0] in ("py3", "cp312") and re.match(r"(none|any)$|manylinux", tags[2]), w.name
    calls = [[carry / "part-1"], [*wheels, carry / "part-2", carry / "manifest.txt"]]
    for carried in calls:
        assert tree_bytes() + sum(p.stat().st_size for p in carried) < LIMIT


@pytest.mark.slow
def test_pytritons_wheel_is_stashed_then_joined_whole_and_a_bad_part_is_refused(
    carry: Path, tmp_path: Path
) -> None:
    env = os.environ | {"GPU_CARRY": str(carry), "GPU_STASH": str(tmp_path / "stash")}
    alone = subprocess.run(["bash", str(CHECK), "join", str(tmp_path)], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert alone.returncode == 1 and "stash its part first" in alone.stderr
    stash = subprocess.run(["bash", str(CHECK), "stash"], env=env, capture_output=True, text=True)
    assert stash.returncode == 0, stash.stderr
    joined = subprocess.run(["bash", str(CHECK), "join", str(tmp_path)], env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert joined.returncode == 0, joined.stderr
    wheel = Path(joined.stdout.strip())
    sha, name = (carry / "manifest.txt").read_text().split()
    assert wheel.name == name and hashlib.sha256(wheel.read_bytes()).hexdigest() == sha
    part = tmp_path / "stash" / "part-1"
    part.write_bytes(part.read_bytes()[:-1] + b"\0")  # one byte changed
    bad = subprocess.run(["bash", str(CHECK), "join", str(tmp_path)], env=env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 1 and "does not match its SHA-256" in bad.stderr
    assert not (tmp_path / name).exists()


def test_a_machine_without_a_gpu_is_refused_in_one_line_and_nothing_runs(tmp_path: Path) -> None:
    env = os.environ | {
        "GPU_CHECK_PYTHON": sys.executable,
        "OUT": str(tmp_path),
        "CUDA_VISIBLE_DEVICES": "",
    }  # none, on a machine with some too
    done = subprocess.run(["bash", str(CHECK)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    import torch

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"gpu-check: no CUDA device here (torch {torch.__version__} sees none): run it on a "
        "lent GPU machine (docs/development.md); nothing was run"
    ]
    assert not list(tmp_path.iterdir())


def test_the_result_names_each_step_its_failure_and_the_machine(tmp_path: Path) -> None:
    steps = [
        {"name": "tests", "command": "python -m pytest -m gpu", "exit": 0, "seconds": 95.2,
         "tail": "6 passed"},
        {"name": "inference", "command": "python benchmarks/inference.py", "exit": 1,
         "seconds": 12.0, "tail": "ImportError: libcudart.so.12: cannot open shared object"},
    ]  # fmt: skip
    facts = machine()
    assert facts["gpu"] == "none" and facts["nvidia-smi (name, driver_version, memory.total, " \
        "compute_cap)"].startswith("nvidia-smi: ")  # fmt: skip
    md = write(steps, facts, tmp_path, "h100-x1")
    assert md.name == f"gpu-check_h100-x1_{facts['date']}.md"
    text = md.read_text()
    assert "| tests | passed | 95 |" in text and "| inference | FAILED (exit 1) | 12 |" in text
    assert "## inference: last lines" in text and "libcudart.so.12" in text
    assert "## tests: last lines" not in text and f"- torch: {facts['torch']}" in text
    assert json.loads(md.with_suffix(".json").read_text()) == {"steps": steps,
                                                                 "environment": facts}  # fmt: skip
    lines = tmp_path / "steps.jsonl"
    lines.write_text("".join(json.dumps(s) + "\n" for s in steps))
    cli = [sys.executable, "-m", "benchmarks.gpu_check", str(lines), "--dest", str(tmp_path)]
    failed = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, check=False)
    assert failed.returncode == 1, failed.stderr
    lines.write_text(json.dumps(steps[0]) + "\n")
    assert subprocess.run(cli, cwd=REPO, capture_output=True, check=False).returncode == 0
