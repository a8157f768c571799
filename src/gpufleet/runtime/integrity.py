"""Checkpoint integrity: a SHA-256 of every file, in the completion marker, checked on load.

DCP writes no content hash (neither does torchtitan), so a shard flipped by bit-rot or cut by
a bad copy loads silently. The Checkpointer records ``files`` in ``COMPLETE.json`` when it
commits a save: ``{name: {"size": bytes, "sha256": hex}}`` for every file of the directory but
the marker itself. Reading the files back (rather than hashing while DCP writes them) also
proves they reached storage whole; it runs off the training thread for async saves.

Importing this module does not import torch: ``gpufleet checkpoints verify`` uses it alone.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from gpufleet.errors import CheckpointMismatchError

MARKER = "COMPLETE.json"
STEP_DIR = re.compile(r"^step_(\d{9})-([0-9a-f]{6})$")
# A marker's record of an encrypted copy (gpufleet.runtime.sealed): its "files" are the stored
# ciphertext's, which verify() checks (the plaintext's are opened and checked with the key).
ENCRYPTION = "encryption"
SET_ASIDE = ".corrupt"  # a set-aside directory's suffix; STEP_DIR never matches it again
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Mismatch:
    """One file that is not what the marker recorded."""

    file: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.file}: expected {self.expected}, got {self.actual}"


def join(a: str, b: str) -> str:
    return f"{a.rstrip('/')}/{b}"


def base_name(entry: str) -> str:
    """The last part of a path or URL (a step directory's name, a file's)."""
    return entry.rstrip("/").rsplit("/", 1)[-1]


def sha256_of(fs: Any, path: str) -> str:
    digest = hashlib.sha256()  # hashlib releases the GIL on large updates: threads overlap
    with fs.open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(
    fs: Any, directory: str, keep: Callable[[str], bool] = lambda _: True
) -> dict[str, dict[str, Any]]:
    """``{name: {"size", "sha256"}}`` for every file in ``directory`` (DCP's shards and its
    ``.metadata``) that ``keep`` takes, but the marker and the marker's temporary file."""
    out = {}
    for info in fs.ls(directory, detail=True):
        name = base_name(info["name"])
        if info.get("type") == "directory" or name.startswith(MARKER) or not keep(name):
            continue
        out[name] = {"size": int(info["size"]), "sha256": sha256_of(fs, info["name"])}
    return dict(sorted(out.items()))


def read_marker(fs: Any, directory: str) -> dict[str, Any]:
    marker: dict[str, Any] = json.loads(fs.cat_file(join(directory, MARKER)))
    return marker


def owner(fs: Any, directory: str) -> str | None:
    """The job that wrote the checkpoint in ``directory``; None when unknown (torn, or its
    marker predates identities)."""
    try:
        identity = read_marker(fs, directory).get("identity") or {}
    except (OSError, ValueError, AttributeError):
        return None
    job = identity.get("job") if isinstance(identity, dict) else None
    return str(job) if job else None


def verify(fs: Any, directory: str, marker: dict[str, Any]) -> list[Mismatch] | None:
    """Every file the marker lists, checked: the mismatches ([] when all match), or None when
    the marker predates checksums (nothing to check against). An encrypted copy's stored
    ciphertext is checked (ENCRYPTION)."""
    sealed = marker.get(ENCRYPTION)
    files = sealed.get("files") if isinstance(sealed, dict) else marker.get("files")
    if not isinstance(files, dict):
        return None
    problems = []
    for name, want in files.items():
        path = join(directory, name)
        if not fs.exists(path):
            problems.append(Mismatch(name, f"sha256 {want['sha256'][:16]}", "no such file"))
            continue
        size = int(fs.size(path))
        if size != want["size"]:
            problems.append(Mismatch(name, f"{want['size']} bytes", f"{size} bytes"))
            continue
        actual = sha256_of(fs, path)
        if actual != want["sha256"]:
            problems.append(Mismatch(name, f"sha256 {want['sha256']}", f"sha256 {actual}"))
    return problems


def check_identity(mine: dict[str, str], marker: dict[str, Any], *, root: str, step: int) -> None:
    """Refuse (CheckpointMismatchError) the checkpoint of ``step`` in ``root`` when its marker
    names another job or another model than ``mine`` (markers before identities carry none:
    nothing to compare)."""
    theirs = marker.get("identity") or {}
    job, other = mine.get("job"), theirs.get("job")
    if job and other and job != other:
        raise CheckpointMismatchError(
            f"the newest checkpoint in {root} (step {step}) belongs to job {other}, "
            f"not {job}: resuming from it would continue another job's training; give each "
            "job its own spec.checkpoint.dir"
        )
    model, written = mine.get("model"), theirs.get("model")
    if model and written and model != written:
        raise CheckpointMismatchError(
            f"the newest checkpoint in {root} (step {step}) was written by another "
            f"model ({theirs.get('workload', '?')}, fingerprint {written}) than this job's "
            f"({mine.get('workload', '?')}, fingerprint {model}): it cannot be loaded; use a "
            "new spec.checkpoint.dir, or run with --fresh to move the old ones aside"
        )


def set_aside(fs: Any, directory: str) -> str:
    """Rename a corrupt checkpoint out of the way (never deleted: it is evidence, and may hold
    what someone wants to salvage); returns its new path. Listing and retention skip it."""
    directory = directory.rstrip("/")
    target = directory + SET_ASIDE
    if fs.exists(target):
        target = f"{target}-{int(time.time())}"
    if isinstance(fs, LocalFileSystem):
        fs.mv(directory, target)  # one rename (fsspec: local moves are of the whole tree)
        return target
    # An object store has no rename and no directories: copy each object, then delete.
    for path in fs.find(directory):
        fs.copy(path, target + path[len(directory) :])
    fs.rm(directory, recursive=True)
    return target


@dataclass(frozen=True)
class Entry:
    """One checkpoint directory as ``gpufleet checkpoints verify`` reports it."""

    step: int
    path: str
    status: str  # OK, CORRUPT, TORN, UNVERIFIED (written before checksums)
    size: int
    world_size: int | None
    problems: tuple[Mismatch, ...] = ()


def survey(fs: Any, root: str) -> list[Entry]:
    """Every step directory under ``root``, oldest first, each verified in full."""
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        match = STEP_DIR.match(base_name(entry))
        if not match:
            continue
        path = join(root, base_name(entry))
        size = sum(int(i["size"]) for i in fs.ls(path, detail=True) if i.get("type") != "directory")
        if not fs.exists(join(path, MARKER)):
            out.append(Entry(int(match.group(1)), path, "TORN", size, None))
            continue
        try:
            marker = read_marker(fs, path)
        except ValueError:
            out.append(Entry(int(match.group(1)), path, "CORRUPT", size, None,
                             (Mismatch(MARKER, "JSON", "unreadable"),)))  # fmt: skip
            continue
        problems = verify(fs, path, marker)
        status = "UNVERIFIED" if problems is None else "CORRUPT" if problems else "OK"
        out.append(Entry(int(match.group(1)), path, status, size, marker.get("world_size"),
                         tuple(problems or ())))  # fmt: skip
    return sorted(out, key=lambda e: (e.step, e.path))
