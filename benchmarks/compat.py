"""The record of a `make compat TORCH=<version>` run (scripts/compat.sh): the core of the suite's
outcome against that torch, from pytest's JUnit XML, with the versions and the machine, into
benchmarks/results/compat-torch-<version>_<hardware>_<date>.md (and .json).

    python benchmarks/compat.py JUNIT_XML PYTEST_EXIT_STATUS
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from benchmarks.common import environment, environment_section, result_path

# The packages a team's environment brings and gpufleet must leave as they are (docs/images.md).
NEIGHBOURS = ("torch", "numpy", "triton", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "scikit-learn")


def outcome(junit: Path) -> dict[str, Any]:
    """Counts, seconds, and each failed or skipped test with its message."""
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
    assert suite is not None, f"{junit}: no testsuite"
    failed, skipped = [], []
    for case in suite.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        found = case.find("failure")
        found = case.find("error") if found is None else found
        if found is not None:  # a failure, or an error (of its set-up or teardown)
            failed.append({"test": name, "message": (found.get("message") or "")[:300]})
        if (skip := case.find("skipped")) is not None:
            skipped.append({"test": name, "reason": skip.get("message") or ""})
    tests, bad = int(suite.get("tests", 0)), len(failed)
    return {
        "tests": tests,
        "passed": tests - bad - len(skipped),
        "failed": bad,
        "skipped": len(skipped),
        "seconds": round(float(suite.get("time", 0.0)), 1),
        "failures": failed,
        "skips": skipped,
    }


def installed() -> dict[str, str]:
    found = {}
    for name in NEIGHBOURS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def report(result: dict[str, Any], status: int) -> list[str]:
    lines = [
        f"# make compat TORCH={torch.__version__.split('+')[0]}: the core of the suite",
        "",
        f"pytest exit status {status}: {result['passed']} passed, {result['failed']} failed, "
        f"{result['skipped']} skipped of {result['tests']}, in {result['seconds']} s "
        "(scripts/compat.sh names the tests).",
        "",
    ]
    if result["failures"]:
        lines += [
            "## Failed",
            "",
            *[f"- `{f['test']}`: {f['message']}" for f in result["failures"]],
            "",
        ]
    if result["skips"]:
        lines += [
            "## Skipped",
            "",
            *[f"- `{s['test']}`: {s['reason']}" for s in result["skips"]],
            "",
        ]
    lines += [
        "## Installed beside gpufleet",
        "",
        *[f"- {k} {v}" for k, v in installed().items()],
        "",
    ]
    return lines + environment_section(environment())


def main(argv: list[str]) -> int:
    junit, status = Path(argv[0]), int(argv[1])
    result = outcome(junit)
    version = torch.__version__.split("+")[0]
    md = result_path(f"compat-torch-{version}")
    md.write_text("\n".join(report(result, status)))
    data = {"status": status, **result, "installed": installed(), "environment": environment()}
    md.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"make compat: {result['passed']} passed, {result['failed']} failed, "
          f"{result['skipped']} skipped; recorded in {md}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
