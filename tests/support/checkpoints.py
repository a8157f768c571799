"""Committed checkpoints as the Checkpointer writes them, and the uploaders that copy them
between tiers (gpufleet.runtime.durable), for the tests of the durable tier."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import fsspec

from gpufleet.runtime.durable import Uploader, tiers
from gpufleet.runtime.integrity import MARKER

JOB = "up"
FILES = {".metadata": b"meta" * 10, "__0_0.distcp": b"\x01\x02" * 500}


def commit(root: str, step: int, files: dict[str, bytes] = FILES, **marker: Any) -> str:
    """A committed checkpoint of ``step`` under ``root`` as the Checkpointer writes one: its
    files, then the marker with each file's size and SHA-256 (``files=None``: no checksums)."""
    fs, base = fsspec.core.url_to_fs(root.removeprefix("file://"))
    name = f"step_{step:09d}-{step:06x}"
    fs.makedirs(f"{base}/{name}", exist_ok=True)
    for file, data in files.items():
        fs.pipe_file(f"{base}/{name}/{file}", data)
    hosts = marker.pop("hosts", {})
    host = marker.setdefault("host", "n0")
    sums = {f: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "host": hosts.get(f, host)}
            for f, d in files.items()}  # fmt: skip
    body = {"step": step, "world_size": 1, "identity": {"job": JOB}, "files": sums, **marker}
    fs.pipe_file(f"{base}/{name}/{MARKER}", json.dumps(body).encode())
    return name


def unchecked(root: Path, step: int) -> None:
    """A checkpoint committed before gpufleet kept checksums (its marker lists no files)."""
    name = commit(str(root), step, files={})
    (root / name / MARKER).write_text(json.dumps({"step": step, "identity": {"job": JOB}}))


def uploader(fast: str, dest: str, *, keep: int = 3, node: str = "n0", **kw: Any) -> Uploader:
    f, d = tiers(fast, dest, JOB, log=kw.pop("log", lambda _m: None))
    return Uploader(f, d, keep=keep, node=node, **kw)


def durable_steps(up: Uploader) -> list[int]:
    return [r.step for r in up.durable.complete()]
