"""The gpufleet CLI as a subprocess of this interpreter, in a plain environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def cli_env() -> dict[str, str]:
    """The environment for CLI subprocesses (no colors, no terminal tricks)."""
    env = dict(os.environ)
    env.update({"NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    env.pop("GPUFLEET_FAULTS", None)
    return env


def gpufleet_cmd(*args: str) -> list[str]:
    """argv for the CLI in this interpreter."""
    return [sys.executable, "-m", "gpufleet.cli.main", *args]


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``gpufleet ARGS`` to completion."""
    return subprocess.run(
        gpufleet_cmd(*args),
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON summary that ``gpufleet run -o json`` printed."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no stdout; stderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]
