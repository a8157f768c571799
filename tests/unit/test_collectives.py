"""gpufleet bench collectives: nccl-tests' formulas, the sweep, and the check that catches a
wrong result (multi-process runs: tests/integration/test_bench.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.bench.collectives import (
    OPS,
    Collective,
    bandwidths,
    elements,
    human_bytes,
    measure,
    sweep,
)
from gpufleet.runtime.distributed import ensure_process_group, shutdown_distributed


@pytest.mark.parametrize(
    ("op", "n", "want"),
    [
        ("all_reduce", 2, 1.0),  # 2(n-1)/n
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),  # (n-1)/n
        ("reduce_scatter", 8, 0.875),
        ("all_to_all", 2, 0.5),
        ("broadcast", 8, 1.0),  # 1
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_bandwidth_factors_are_nccl_tests(op: str, n: int, want: float) -> None:
    assert OPS[op].bus_factor(n) == pytest.approx(want)
    algbw, busbw = bandwidths(OPS[op], 4_000_000_000, 2.0, n)
    assert algbw == pytest.approx(2.0)  # GB/s: 10^9 bytes per second
    assert busbw == pytest.approx(2.0 * want)


def test_the_sweep_doubles_from_min_to_max() -> None:
    assert sweep(8, 64) == [8, 16, 32, 64]
    assert sweep(8, 100) == [8, 16, 32, 64]
    assert sweep(1 << 20, 1 << 30)[-1] == 1 << 30 and len(sweep(1 << 20, 1 << 30)) == 11
    assert [human_bytes(s) for s in (8, 4096, 3 << 20, 1 << 30, 12)] == [
        "8 B",
        "4 KiB",
        "3 MiB",
        "1 GiB",
        "12 B",
    ]


def test_split_collectives_round_the_count_to_a_multiple_of_the_ranks() -> None:
    assert elements(OPS["all_reduce"], 8, 4) == 2  # not split: 2 floats
    assert elements(OPS["all_gather"], 8, 4) == 4  # at least one per rank
    assert elements(OPS["reduce_scatter"], 40, 4) == 8  # 10 floats -> 8
    assert elements(OPS["all_to_all"], 1 << 20, 3) == (1 << 18) - (1 << 18) % 3


@pytest.fixture
def one_rank() -> Iterator[None]:
    ensure_process_group()
    yield
    shutdown_distributed()


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(("op", "mode"), [(o, m) for o in OPS for m in OPS[o].modes])
def test_every_op_and_mode_runs_and_checks(op: str, mode: str) -> None:
    import torch

    row = measure(OPS[op], mode, 4096, torch.device("cpu"), min_seconds=0.001, max_iters=3)
    assert row.correct and row.ranks == 1 and row.bytes == 4096 and row.count == 1024
    assert 1 <= row.iterations <= 3 and row.seconds > 0
    assert row.algbw_gbps == pytest.approx(4096 / row.seconds / 1e9)


class Corrupting(Collective):
    """A collective whose result is off by one element: what a broken transport would give."""

    def __call__(self) -> None:
        super().__call__()
        self.out.view(-1)[-1] += 1


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(("op", "mode"), [(o, m) for o in OPS for m in OPS[o].modes])
def test_the_check_catches_a_wrong_result(op: str, mode: str) -> None:
    import torch

    assert Collective(OPS[op], mode, 64, torch.device("cpu")).check()
    assert not Corrupting(OPS[op], mode, 64, torch.device("cpu")).check()
