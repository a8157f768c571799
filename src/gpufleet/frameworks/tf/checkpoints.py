"""A TensorFlow job's checkpoints: tf.train.Checkpoint's files in gpufleet's step directories.

Each save is ``<root>/step_<9 digits>-<6 hex>/ckpt.{index,data-*}`` (TensorFlow's own format,
written by ``tf.train.Checkpoint.write``) with gpufleet's ``COMPLETE.json`` beside it, exactly
as a PyTorch job's DCP directories have it: the SHA-256 of every file and the job's identity.
So the same rules hold: a directory without its marker is torn and never loaded, a corrupt one
is set aside with a warning and the previous one tried, another job's is refused, and
``gpufleet checkpoints verify`` checks either kind. tf.train.CheckpointManager keeps every save
in one directory with a shared ``checkpoint`` index file, which would leave no per-save unit to
mark complete, verify or set aside; it is therefore not used.

With MultiWorkerMirroredStrategy every worker must write (the save may run collectives); the
chief (task 0) writes into the step directory, the others into a temporary directory removed
after (TensorFlow's documented pattern). Imports no TensorFlow: the caller passes ``write``.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec

from gpufleet.errors import CheckpointError, NoUsableCheckpointError
from gpufleet.runtime import integrity
from gpufleet.runtime.files import write_json_atomic

PREFIX = "ckpt"  # tf.train.Checkpoint's file prefix inside a step directory


class TfCheckpoints:
    """The step directories under ``root`` (a local directory or a mounted volume)."""

    def __init__(
        self,
        root: str,
        *,
        every_steps: int,
        keep: int,
        identity: dict[str, str],
        chief: bool,
        log: Callable[[str], None],
    ) -> None:
        self.root = Path(root.removeprefix("file://"))
        self.every_steps = every_steps
        self.keep = keep
        self.identity = identity
        self.chief = chief
        self._log = log
        self._fs = fsspec.filesystem("file")
        if chief:
            self.root.mkdir(parents=True, exist_ok=True)

    def should_save(self, step: int, *, final: bool = False, preempted: bool = False) -> bool:
        """Every ``every_steps`` steps, the last step and the step all workers stop at."""
        return preempted or final or step % self.every_steps == 0

    def dirs(self) -> list[tuple[int, Path, bool]]:
        """Every step directory as (step, path, complete), oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for path in self.root.iterdir():
            match = integrity.STEP_DIR.match(path.name)
            if match and path.is_dir():
                out.append((int(match.group(1)), path, (path / integrity.MARKER).exists()))
        return sorted(out)

    def newest_usable(self) -> int | None:
        """The chief's verdict: the step of the newest complete checkpoint whose files match
        their checksums. Corrupt ones are set aside on the way; raises NoUsableCheckpointError
        when every complete one is corrupt, CheckpointMismatchError when it is another job's."""
        set_aside = []
        for step, path, complete in reversed(self.dirs()):
            if not complete:
                continue
            try:
                marker = integrity.read_marker(self._fs, str(path))
                problems = integrity.verify(self._fs, str(path), marker)
            except (ValueError, KeyError, TypeError) as exc:
                marker = {}
                problems = [integrity.Mismatch(integrity.MARKER, "a JSON marker", str(exc))]
            if problems:
                aside = integrity.set_aside(self._fs, str(path))
                set_aside.append(aside)
                self._log(f"gpufleet: WARNING checkpoint step {step} is corrupt ("
                          f"{'; '.join(map(str, problems))}); set aside as {aside}, trying the "
                          "previous one")  # fmt: skip
                continue
            integrity.check_identity(self.identity, marker, root=str(self.root), step=step)
            return step
        if set_aside:
            raise NoUsableCheckpointError(
                f"no usable checkpoint in {self.root}: every complete one is corrupt (set aside: "
                f"{', '.join(set_aside)}); run with --fresh to start over from step 0"
            )
        return None

    def prefix_of(self, step: int) -> str:
        """The tf.train.Checkpoint prefix of the complete checkpoint of ``step`` (the one the
        chief chose: the newest name among that step's complete directories)."""
        found = [path for s, path, complete in self.dirs() if s == step and complete]
        if not found:
            raise CheckpointError(f"no complete checkpoint of step {step} in {self.root}")
        return str(found[-1] / PREFIX)

    def save(self, step: int, write: Callable[[str], Any], *, world_size: int) -> str:
        """Every worker calls this at the same step: ``write(prefix)`` saves the state (the
        chief's into a new step directory, the others' into a temporary one); the chief then
        commits the marker and drops old checkpoints. Returns the step directory (chief) or ''."""
        started = time.perf_counter()
        if not self.chief:
            scratch = tempfile.mkdtemp(prefix="gpufleet-tf-ckpt-")
            try:
                write(str(Path(scratch) / PREFIX))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return ""
        path = self._new_dir(step)
        write(str(path / PREFIX))
        files = integrity.file_digests(self._fs, str(path))
        marker = {"step": step, "world_size": world_size,
                  "seconds": time.perf_counter() - started, "identity": self.identity,
                  "files": files, "format": "tf.train.Checkpoint"}  # fmt: skip
        write_json_atomic(path / integrity.MARKER, marker)
        self._purge(step)
        return str(path)

    def _new_dir(self, step: int) -> Path:
        for _ in range(8):
            path = self.root / f"step_{step:09d}-{secrets.token_hex(3)}"
            if not path.exists():
                path.mkdir(parents=True)
                return path
        raise CheckpointError(f"no unused checkpoint directory name for step {step} in {self.root}")

    def _purge(self, newest: int) -> None:
        """Keep the newest ``keep`` complete checkpoints of this job (never another job's);
        torn directories at or below the newest commit can never complete and go too."""
        dirs = self.dirs()
        job = self.identity.get("job")
        complete = [p for _, p, ok in dirs
                    if ok and integrity.owner(self._fs, str(p)) in (None, job)]  # fmt: skip
        doomed = complete[: max(0, len(complete) - self.keep)]
        doomed += [p for s, p, ok in dirs if not ok and s <= newest]
        for path in doomed:
            try:
                shutil.rmtree(path)
            except OSError as exc:  # a failed delete must not fail training; retried next time
                self._log(f"gpufleet: could not delete old checkpoint {path}: {exc}")
