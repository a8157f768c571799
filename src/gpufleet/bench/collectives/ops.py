"""The collectives ``gpufleet bench collectives`` measures, their sizes and nccl-tests' formulas.

All-reduce, all-gather, reduce-scatter, broadcast and all-to-all over a size sweep, through
``torch.distributed`` (gloo on CPU, nccl with GPUs), each result checked element by element.
The numbers follow nccl-tests' definitions (its doc/PERFORMANCE.md), so they compare with
nccl-tests runs and across cluster sizes:

* ``size`` is the bytes of the whole buffer: an all-reduce's or broadcast's tensor, an
  all-gather's output, a reduce-scatter's input, an all-to-all's input (all ranks' parts).
* algorithm bandwidth ``algbw = size / time``.
* bus bandwidth ``busbw = algbw x factor``, the traffic each link carries, comparable to the
  hardware's peak whatever the rank count: all-reduce ``2(n-1)/n``; all-gather, reduce-scatter
  and all-to-all ``(n-1)/n``; broadcast ``1``.
* out-of-place and in-place where torch has both forms (all-gather: the input is this rank's
  slice of the output; reduce-scatter: the output is this rank's slice of the input). torch's
  all-reduce and broadcast exist in place only; all-to-all out of place only.


The pure parts the plan, the worker and the report share (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

ELEMENT = 4  # bytes of a float32, the element type measured


@dataclass(frozen=True)
class Op:
    """One collective: its bus-bandwidth factor and the modes torch offers."""

    name: str
    modes: tuple[str, ...]

    def bus_factor(self, n: int) -> float:
        """busbw / algbw for ``n`` ranks (nccl-tests' doc/PERFORMANCE.md)."""
        if self.name == "all_reduce":
            return 2 * (n - 1) / n
        if self.name == "broadcast":
            return 1.0
        return (n - 1) / n

    def split(self) -> bool:
        """Whether the buffer is cut into one part per rank (its count must divide by n)."""
        return self.name in ("all_gather", "reduce_scatter", "all_to_all")


OPS = {
    op.name: op
    for op in (
        Op("all_reduce", ("in-place",)),
        Op("all_gather", ("out-of-place", "in-place")),
        Op("reduce_scatter", ("out-of-place", "in-place")),
        Op("broadcast", ("in-place",)),
        Op("all_to_all", ("out-of-place",)),
    )
}


def sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes``, multiplying by ``factor`` (nccl-tests -f)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def elements(op: Op, size: int, n: int) -> int:
    """Float32 elements of the whole buffer for ``size`` bytes: a multiple of ``n`` for split
    collectives (rounded down, as nccl-tests does), at least one per rank."""
    count = max(1, size // ELEMENT)
    if op.split():
        count = max(n, count - count % n)
    return count


@dataclass
class Row:
    """One (op, size, mode) measured."""

    op: str
    mode: str
    bytes: int
    count: int
    ranks: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool
    iterations: int


def bandwidths(op: Op, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes/s, as nccl-tests prints them)."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * op.bus_factor(n)


def human_bytes(n: int) -> str:
    """8 B, 4 KiB, 1 MiB, 1 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
