"""What the chaos tests (tests/chaos/) share: the seed of their random choices, the digits job's
length, an uninterrupted run to compare with, and the ranks' logs.

The random choices come from GPUFLEET_CHAOS_SEED: a fixed one by default (`make test` runs the
same cases every time), a new one under `make fuzz`; a failure prints its seed to replay it. One
generator for every chaos module, so that each draw is the one it was before they were split.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from tests.support import refcache
from tests.support.cli import run_cli, summary_of
from tests.support.specs import write_spec

SEED = int(os.environ.get("GPUFLEET_CHAOS_SEED") or 20261124)
RNG = random.Random(SEED)
STEPS = 40


def straight_run(
    factory: pytest.TempPathFactory,
    where: str,
    doc: dict[str, Any],
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The summary of an uninterrupted run of ``doc`` in a fresh directory named ``where``;
    without an ``env`` of its own, an earlier session's run of it when the code, the packages
    and the machine are the same (tests/support/refcache.py): its digest, loss and steps are
    what the tests compare, never its files."""

    def run() -> dict[str, Any]:
        wd = factory.mktemp(where)
        proc = run_cli("run", str(write_spec(wd, doc)), "-o", "json", cwd=wd, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return summary_of(proc)

    return run() if env is not None else refcache.reference(doc, run)


def rank_logs(workdir: Path, name: str) -> str:
    logs = sorted((workdir / ".gpufleet/runs" / name / "logs").glob("node*/*/attempt_*/*/*.log"))
    return "\n".join(f"== {p}\n{p.read_text(errors='replace')}" for p in logs)
