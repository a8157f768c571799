"""What one ``gpufleet bench collectives`` run is asked: the one home of its defaults, read by
the CLI's options and by the worker's own arguments."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet.bench.collectives.ops import OPS, human_bytes
from gpufleet.errors import FieldError, UserInputError

SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MAX_BYTES = 1 << 30  # the sweep's top without --max-bytes (lowered to what memory holds)
QUICK_MAX_BYTES = 1 << 20


def parse_size(text: str, option: str) -> int:
    """``8``, ``64KiB``, ``1MiB``, ``1GiB`` as bytes; UserInputError naming ``option`` else."""
    match = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", text)
    if not match or int(match.group(1)) < 1:
        raise UserInputError(
            [FieldError(option, f"must be a size like 8, 64KiB, 1MiB or 1GiB, got {text!r}")]
        )
    return int(match.group(1)) * SIZE_UNITS[match.group(2) or ""]


@dataclass(frozen=True, kw_only=True)
class CollectivesConfig:
    """One collectives sweep: where (``procs`` x ``nodes`` here), what, and how long."""

    procs: int = 2  # worker processes per node
    nodes: int = 1
    ops: tuple[str, ...] = tuple(OPS)
    min_bytes: int = 8
    max_bytes: int | None = None  # None: MAX_BYTES (quick: QUICK_MAX_BYTES), fitted to memory
    quick: bool = False
    outdir: Path = Path("bench-results/collectives")
    factor: int = 2  # sizes multiply by this (nccl-tests -f)
    min_seconds: float = 0.2  # each size is timed for about this long ...
    max_iters: int = 50  # ... in at most this many calls
    quick_min_seconds: float = 0.02
    quick_max_iters: int = 5

    @classmethod
    def parse(
        cls,
        *,
        procs: int,
        nodes: int,
        ops: str,
        min_bytes: str,
        max_bytes: str | None,
        quick: bool,
        outdir: Path,
    ) -> CollectivesConfig:
        """The config of the CLI's options, sizes and ops given as text; UserInputError naming
        the first option that is wrong."""
        wanted = tuple(o.strip() for o in ops.split(",") if o.strip())
        unknown = [o for o in wanted if o not in OPS]
        if unknown or not wanted:
            raise UserInputError(
                [
                    FieldError(
                        "--ops",
                        f"unknown {', '.join(unknown) or 'empty'}; choose from {', '.join(OPS)}",
                    )
                ]
            )
        low = parse_size(min_bytes, "--min-bytes")
        high = parse_size(max_bytes, "--max-bytes") if max_bytes else None
        config = cls(
            procs=procs,
            nodes=nodes,
            ops=wanted,
            min_bytes=low,
            max_bytes=high,
            quick=quick,
            outdir=outdir,
        )
        if low > config.top():
            raise UserInputError(
                [
                    FieldError(
                        "--min-bytes",
                        f"{human_bytes(low)} is above --max-bytes {human_bytes(config.top())}",
                    )
                ]
            )
        return config

    def top(self) -> int:
        """The largest size asked for: ``max_bytes``, else the default for ``quick``."""
        if self.max_bytes is not None:
            return self.max_bytes
        return QUICK_MAX_BYTES if self.quick else MAX_BYTES

    def timing(self) -> tuple[float, int]:
        """(min seconds, max iterations) per size, after ``quick``."""
        if self.quick:
            return self.quick_min_seconds, self.quick_max_iters
        return self.min_seconds, self.max_iters
