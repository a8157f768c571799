"""The reference runs' summaries on disk, from one test session to the next (issue 50: "cache
it on disk, keyed by everything that decides its result"). The key is the job's spec (its
checkpoint directory left out: it changes no weight) and what runs it: gpufleet's sources,
every installed distribution's version, Python, the environment's GPUFLEET_/OMP_/MKL_/TORCH
variables, and the CPU's model and flags (torch's kernels differ by instruction set, and so
do the weights). A change to any of them is another key, so the run happens again; a
different machine or a new torch never reads an old digest.

$GPUFLEET_REFERENCE_CACHE, else ~/.cache/gpufleet/references; an entry is a run's JSON summary
(about 1 KB), and entries not used for KEEP_DAYS go when another is written."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.runtime.context import ENV_CACHE_DIR
from tests.support.paths import REPO

CACHE_ENV = "GPUFLEET_REFERENCE_CACHE"
KEEP_DAYS = 14
ENV_PREFIXES = ("GPUFLEET_", "OMP_", "MKL_", "TORCH", "CUBLAS_", "PYTHONHASHSEED")
# Where a run reads its data from, not what it computes: each session's own directory
# (tests/conftest.py, own_cache_dir), which made every session's key another, so that no
# session ever read an earlier one's run.
PLACES = (ENV_CACHE_DIR,)
PLACEHOLDER = "<checkpoints>"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "gpufleet" / "references"
    return Path(os.environ.get(CACHE_ENV) or default)


def _cpu() -> str:
    """The CPU's model names and flags (/proc/cpuinfo), without the per-core lines."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(sorted({ln for ln in lines if ln.split(":")[0].strip() in wanted}))


@functools.cache
def machine_and_code() -> str:
    """A digest of everything but the spec that decides a run's result."""
    digest = hashlib.sha256()
    src = REPO / "src" / "gpufleet"
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    env = sorted(f"{k}={v}" for k, v in os.environ.items()
                 if k.startswith(ENV_PREFIXES) and k not in PLACES)  # fmt: skip
    for part in (*dists, *env, sys.version, platform.machine(), _cpu()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def key(doc: dict[str, Any]) -> str:
    """The cache key of a run of the job ``doc``."""
    checkpoint = {**doc["spec"].get("checkpoint", {}), "dir": PLACEHOLDER}
    spec = {**doc, "spec": {**doc["spec"], "checkpoint": checkpoint}}
    text = json.dumps(spec, sort_keys=True) + machine_and_code()
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(doc: dict[str, Any]) -> str | None:
    """The summary (`gpufleet run -o json`'s stdout) of an earlier run of ``doc``, if any."""
    path = cache_dir() / f"{key(doc)}.json"
    try:
        text = path.read_text()
        os.utime(path)  # used: kept another KEEP_DAYS
    except OSError:
        return None
    return text


def store(doc: dict[str, Any], summary: str) -> None:
    """Keep a successful run's summary; drop entries unused for KEEP_DAYS."""
    where = cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{key(doc)}.json"
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(summary)
    partial.replace(path)  # whole or not at all, as two workers may write one key
    too_old = time.time() - KEEP_DAYS * 86400
    for old in where.glob("*.json"):
        if old.stat().st_mtime < too_old:
            old.unlink(missing_ok=True)


def reference(doc: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The summary of an uninterrupted run of ``doc``: an earlier session's, else
    ``compute()``'s (a run that asserts its success), kept for the sessions after."""
    cached = load(doc)
    if cached is not None:
        return dict(json.loads(cached))
    result = compute()
    store(doc, json.dumps(result))
    return result
