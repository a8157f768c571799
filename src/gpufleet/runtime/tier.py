"""One checkpoint tier: a directory or fsspec URI holding step directories
(gpufleet.runtime.checkpoint describes the layout). A job has a fast tier, where its loop saves,
and may have a durable one, which the node's uploader fills (gpufleet.runtime.durable); both
are read the same way: listed, verified against their markers, purged to their ``keep``.

Importing this module does not import torch: the launcher's uploader and ``gpufleet status``
use it alone.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec

from gpufleet.runtime import integrity
from gpufleet.runtime.files import write_atomic_fs
from gpufleet.runtime.integrity import MARKER

FAST, DURABLE = "fast", "durable"  # the tiers' names, in logs, refs and reports


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint: its step, where it lies, the world size that wrote it, and the
    tier it was found on."""

    step: int
    path: str
    world_size: int | None = None
    tier: str = FAST
    sealed: bool = False  # encrypted (spec.checkpoint.durable.encryption): opened to read


def is_local(root: str) -> bool:
    """Whether ``root`` is a local path (plain or ``file://``) rather than an fsspec URI."""
    return "://" not in root or root.startswith("file://")


class Tier:
    """The step directories under ``root``; ``identity["job"]`` names whose they are."""

    def __init__(
        self,
        root: str,
        *,
        name: str = FAST,
        identity: dict[str, str] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.local = is_local(root)
        self.root = root.removeprefix("file://").rstrip("/") if self.local else root.rstrip("/")
        self.identity = identity or {}
        self.fs, self.root_path = fsspec.core.url_to_fs(self.root)
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    join = staticmethod(integrity.join)

    def url(self, path: str) -> str:
        """A path as users and DCP's fsspec reader name it: plain locally, with scheme else."""
        return path if self.local else str(self.fs.unstrip_protocol(path))

    def fs_path(self, url: str) -> str:
        """A path as the filesystem object names it (a ref's path may carry the scheme)."""
        return url if self.local else str(self.fs._strip_protocol(url))

    def makedirs(self) -> None:
        self.fs.makedirs(self.root_path, exist_ok=True)

    def list_dirs(self) -> list[tuple[int, str, bool]]:
        """Every step directory as (step, path, complete), oldest first."""
        self.fs.invalidate_cache(self.root_path)  # other ranks, attempts and uploads write here
        try:
            entries = self.fs.ls(self.root_path, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            match = integrity.STEP_DIR.match(name)
            if match:
                path = self.join(self.root_path, name)
                out.append((int(match.group(1)), path, self.fs.exists(self.join(path, MARKER))))
        return sorted(out)

    def complete(self) -> list[CheckpointRef]:
        """Complete checkpoints, oldest first."""
        dirs = self.list_dirs()
        return [CheckpointRef(s, self.url(p), tier=self.name) for s, p, ok in dirs if ok]

    def mine(self, path: str) -> bool:
        """Whether the complete checkpoint at ``path`` is this job's (unknown counts as mine:
        markers before identities, and Checkpointers without one)."""
        job = self.identity.get("job")
        return not job or integrity.owner(self.fs, path) in (None, job)

    def write_atomic(self, path: str, data: bytes) -> None:
        write_atomic_fs(self.fs, path, data, local=self.local)

    def check(self, ref: CheckpointRef) -> tuple[dict[str, Any], list[integrity.Mismatch] | None]:
        """``ref``'s marker and its files' mismatches ([]: all match; None: no checksums)."""
        path = self.fs_path(ref.path)
        try:
            marker = integrity.read_marker(self.fs, path)
            return marker, integrity.verify(self.fs, path, marker)
        except (ValueError, KeyError, TypeError) as exc:  # an unreadable marker
            return {}, [integrity.Mismatch(MARKER, "a JSON marker", str(exc))]

    def set_aside(self, ref: CheckpointRef) -> str:
        """Move a corrupt ``ref`` out of the way (never deleted); its new URL."""
        return self.url(integrity.set_aside(self.fs, self.fs_path(ref.path)))

    def purge(self, newest: int, keep: int) -> None:
        """Keep this job's ``keep`` newest complete checkpoints; remove torn directories at or
        below ``newest`` (newer ones may belong to a save or upload still being written).
        Another job's checkpoints are never touched; a failed delete is retried next time."""
        dirs = self.list_dirs()
        complete = [p for _, p, ok in dirs if ok and self.mine(p)]
        doomed = complete[: max(0, len(complete) - keep)]
        doomed += [p for s, p, ok in dirs if not ok and s <= newest]
        for path in doomed:
            try:
                self.fs.rm(path, recursive=True)
            except OSError as exc:
                self.log(f"gpufleet: could not delete old checkpoint {path}: {exc}")

    def remove(self, path: str) -> None:
        """Remove a step directory, quietly when it is already gone or cannot be."""
        with contextlib.suppress(OSError):
            self.fs.rm(path, recursive=True)
