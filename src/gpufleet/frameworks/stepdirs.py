"""Checkpoints of a job of another framework (spec.framework) in gpufleet's step directories:
``<root>/step_<9 digits>-<6 hex>/`` holding the framework's own files and gpufleet's
``COMPLETE.json`` beside them, exactly as a PyTorch job's DCP directories have it: the SHA-256
of every file and the job's identity. So the same rules hold: a directory without its marker is
torn and never loaded, a corrupt one is set aside with a warning and the previous one tried,
another job's is refused, and ``gpufleet checkpoints verify`` checks either kind.

``write`` is for frameworks whose every worker takes part in a save (TensorFlow's
MultiWorkerMirroredStrategy: the chief writes into the step directory, the others into a
temporary directory removed after); ``mark`` commits a directory written otherwise (Ray
Train's, which Ray copies into place)."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec

from gpufleet.errors import CheckpointError, CheckpointMismatchError, NoUsableCheckpointError
from gpufleet.runtime import integrity
from gpufleet.runtime.files import write_json_atomic

PREFIX = "ckpt"  # the framework's file prefix inside a step directory (``write``)


class StepCheckpoints:
    """The step directories under ``root`` (a local directory or a mounted volume) of a job of
    ``framework`` (named in messages), whose checkpoints are in ``format``."""

    framework = "this framework's"
    format = ""

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

    def newest_usable(self, world_size: int) -> Path | None:
        """The chief's verdict: the newest complete checkpoint whose files match their
        checksums. Corrupt ones are set aside on the way; raises NoUsableCheckpointError when
        every complete one is corrupt, CheckpointMismatchError when it is another job's or
        model's, or was written by another number of workers (the global batch is theirs)."""
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
            written = marker.get("world_size")
            if written not in (None, world_size):
                raise CheckpointMismatchError(
                    f"the newest checkpoint in {self.root} (step {step}) was written by "
                    f"{written} workers, this job has {world_size}: a {self.framework} job "
                    f"resumes on its own number of workers (set spec.nodes to {written}), or "
                    "run with --fresh to start over"
                )
            return path
        if set_aside:
            raise NoUsableCheckpointError(
                f"no usable checkpoint in {self.root}: every complete one is corrupt (set aside: "
                f"{', '.join(set_aside)}); run with --fresh to start over from step 0"
            )
        return None

    def new_name(self, step: int) -> str:
        """A step directory name for ``step`` that is not taken under ``root``."""
        for _ in range(8):
            name = f"step_{step:09d}-{secrets.token_hex(3)}"
            if not (self.root / name).exists():
                return name
        raise CheckpointError(f"no unused checkpoint directory name for step {step} in {self.root}")

    def new_dir(self, step: int) -> Path:
        """The chief: a new, empty step directory for ``step`` (its name is then agreed)."""
        path = self.root / self.new_name(step)
        path.mkdir(parents=True)
        return path

    def write(self, path: Path, step: int, write: Callable[[str], Any], *, world_size: int) -> None:
        """Every worker calls this at the same step with the agreed ``path``: ``write(prefix)``
        saves the state (the chief's into ``path``, the others' into a temporary directory);
        the chief then commits the marker and drops old checkpoints."""
        started = time.perf_counter()
        if not self.chief:
            scratch = tempfile.mkdtemp(prefix="gpufleet-ckpt-")
            try:
                write(str(Path(scratch) / PREFIX))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        write(str(path / PREFIX))
        self.mark(path, step, world_size=world_size, seconds=time.perf_counter() - started)
        self.purge(step)

    def mark(self, path: Path, step: int, *, world_size: int, seconds: float) -> None:
        """Commit ``path``: gpufleet's marker, with the SHA-256 of every file in it and the
        job's identity, written last."""
        files = integrity.file_digests(self._fs, str(path))
        marker = {"step": step, "world_size": world_size, "seconds": seconds,
                  "identity": self.identity, "files": files, "format": self.format}  # fmt: skip
        write_json_atomic(path / integrity.MARKER, marker)

    def purge(self, newest: int) -> None:
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
