"""The sample-id log: which samples every step trained on, across restarts and world sizes.

With GPUFLEET_SAMPLE_LOG=<dir> every Trainer rank appends one JSON line per step to
``<dir>/<attempt>-rank<R>-of-<W>.jsonl``: ``{"step": s, "epoch": e, "ids": [...]}``. An attempt
is one start of the worker group (all its ranks share the name, rank 0's start time). A step
that an attempt ran but did not checkpoint is run again by the next one; ``read_sample_log``
keeps, for each step, what the latest attempt that ran it trained on, which is what the final
weights saw.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_NAME = re.compile(r"^(\d+)-rank(\d+)-of-(\d+)\.jsonl$")


@dataclass
class SampleLog:
    """One rank's writer (line-buffered: a crash loses at most the line being written)."""

    directory: Path
    attempt: int  # rank 0's start time in ns, shared by every rank of the attempt
    rank: int
    world_size: int
    _fh: IO[str] | None = field(default=None, repr=False)

    def write(self, step: int, epoch: int, ids: list[int]) -> None:
        """Record that ``step`` (of ``epoch``) trained on samples ``ids`` on this rank."""
        if self._fh is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"{self.attempt:020d}-rank{self.rank}-of-{self.world_size}.jsonl"
            self._fh = open(self.directory / name, "a", buffering=1)  # noqa: SIM115
        self._fh.write(json.dumps({"step": step, "epoch": epoch, "ids": ids}) + "\n")

    def close(self) -> None:
        """Close the file (the Trainer calls it when fit() ends)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def attempt_id() -> int:
    """A new attempt's id (the Trainer broadcasts rank 0's to every rank)."""
    return time.time_ns()


def open_for_rank(directory: Path, rank: int, world_size: int) -> SampleLog:
    """This rank's log of an attempt, under rank 0's attempt id (collective when a process
    group is up: every rank calls it). Imports torch only here: readers of logs need none."""
    import torch.distributed as dist

    from gpufleet.runtime.distributed import control_group

    box = [attempt_id() if rank == 0 else 0]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0, group=control_group())
    return SampleLog(directory, box[0], rank, world_size)


@dataclass(frozen=True)
class LoggedStep:
    """What one step trained on: its epoch, the world size that ran it, and every sample id
    of the global batch in rank order."""

    epoch: int
    world_size: int
    ids: list[int]


def read_sample_log(directory: Path) -> dict[int, LoggedStep]:
    """Each step's samples as the final weights saw them: the latest attempt that ran it.
    Raises ValueError when that attempt's ranks disagree on the epoch or one rank is missing."""
    attempts: dict[int, dict[int, dict[int, dict[str, object]]]] = {}  # attempt → step → rank
    worlds: dict[int, int] = {}
    for path in directory.glob("*.jsonl"):
        match = _NAME.match(path.name)
        if not match:
            continue
        attempt, rank, world = (int(g) for g in match.groups())
        worlds[attempt] = world
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                attempts.setdefault(attempt, {}).setdefault(entry["step"], {})[rank] = entry
    latest: dict[int, int] = {}  # step → the latest attempt that ran it
    for attempt in sorted(attempts):
        for step in attempts[attempt]:
            latest[step] = attempt
    out: dict[int, LoggedStep] = {}
    for step, attempt in sorted(latest.items()):
        ranks, world = attempts[attempt][step], worlds[attempt]
        if sorted(ranks) != list(range(world)):
            raise ValueError(
                f"attempt {attempt}: step {step} logged by ranks {sorted(ranks)} of {world}"
            )
        epochs = {int(str(e["epoch"])) for e in ranks.values()}
        if len(epochs) != 1:
            raise ValueError(f"attempt {attempt}: step {step} in epochs {sorted(epochs)}")
        ids = [int(i) for r in range(world) for i in _ids(ranks[r])]
        out[step] = LoggedStep(epochs.pop(), world, ids)
    return out


def _ids(entry: dict[str, object]) -> list[int]:
    ids = entry["ids"]
    if not isinstance(ids, list):
        raise ValueError(f"not a list of ids: {ids!r}")
    return [int(i) for i in ids]
