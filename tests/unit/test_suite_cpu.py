"""benchmarks/suite_cpu.py: the kernel's accounting records read back, and each process given
its kind (on records written here: acct(2) itself is one switch for the whole machine, which a
measured run of this suite holds)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import suite_cpu


def record(pid: int, ppid: int, start: int, cpu_ticks: int, comm: bytes, flag: int = 0) -> bytes:
    """A struct acct_v3 as the kernel writes it, its CPU all user time (ticks fit comp_t's
    mantissa below 8192)."""
    return suite_cpu.RECORD.pack(flag, 3, 0, 0, 0, 0, pid, ppid, start, 1.0,
                                 cpu_ticks, 0, 0, 0, 0, 0, 0, 0, comm)  # fmt: skip


def test_comp_t_is_a_base_8_float_of_ticks() -> None:
    assert suite_cpu.comp_t(250) == 2.5
    assert suite_cpu.comp_t((1 << 13) | 1000) == 80.0  # 1000 * 8 ticks


class Seen(suite_cpu.Sampler):
    def __init__(self, seen: dict[tuple[int, int], str]) -> None:
        self.seen, self.last = seen, {pid: cmd for (pid, _), cmd in seen.items()}


def test_records_get_their_command_lines_kind_and_forks_their_parents(tmp_path: Path) -> None:
    pacct = tmp_path / "x.pacct"
    pacct.write_bytes(
        record(10, 1, 100, 300, b"python")  # the agent: its command line was seen
        + record(11, 10, 101, 50, b"python", flag=suite_cpu.AFORK)  # its forked worker
        + record(12, 1, 102, 120, b"kube-apiserver")  # a daemon: its own name
        + record(13, 1, 103, 60, b"python")  # a CLI call the sampler saw
        + record(14, 13, 103, 5, b"python")  # too short to be seen: its parent's kind
    )
    seen = {(10, 100): "/v/python -m gpufleet.launch.node a.json b.json 9",
            (13, 103): "/v/python -m gpufleet.cli.main status job -n t"}  # fmt: skip
    procs = suite_cpu.classify(suite_cpu.read_records(pacct), Seen(seen))
    got = [(p.kind, p.cpu) for p in procs]
    assert got == [("gpufleet local node agent", 3.0),
                   ("gpufleet local node agent (forked)", 0.5),
                   ("kube-apiserver", 1.2), ("gpufleet status", 0.6),
                   ("gpufleet status", 0.05)]  # fmt: skip
    text = suite_cpu.table(procs, total=6.0, wall=3.0, command=["make", "test"])
    assert "| gpufleet local node agent | 3 | 50.0 % | 1 | 3.00 |" in text
    assert "| not in any record (the kernel; still running) | 1 |" in text
