"""Where the machine's CPU goes while a command runs (issue 50, item 1), by kind of process: the
test workers, each `gpufleet` subcommand, the local runs' agents and their forked workers, the
pods, each cluster daemon, Ray, TensorFlow, the servers the tests start, the builds.

The kernel's process accounting (acct(2), BSD v3 records: every process's CPU when it ends,
the short-lived ones too) gives the CPU; its records name a process only by its first 15
characters (`python`), so a sampler reads every process's command line from /proc every second
and the kinds come from those (a process that lived under a second takes its parent's kind).
The machine's busy time (/proc/stat) over the command is the total; what no record covers is
the kernel's own work and the processes still alive at the end. Needs root.

    python benchmarks/suite_cpu.py -o benchmarks/results/suite-cpu_X -- make test
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from common import environment, environment_section, machine_busy

RECORD = struct.Struct("<BBHIIIIIIf8H16s")  # struct acct_v3 (linux/acct.h), 64 bytes
AFORK = 0x01  # forked, never exec'd: a copy of its parent (the forkserver's workers)
TICKS = os.sysconf("SC_CLK_TCK")
AHZ = 100  # comp_t's unit: 1/AHZ s
SAMPLE_S = 1.0

# (kind, pattern on the command line), first match wins; then the daemons by their name.
KINDS = [
    ("pytest worker", r"execnet|xdist|-m pytest|bin/pytest|exec\(eval\(sys\.stdin"),
    ("gpufleet pod launcher", r"gpufleet\.launch\.pod"),
    ("gpufleet local node agent", r"gpufleet\.launch\.node"),
    ("gpufleet worker (exec'd)", r"gpufleet\.launch\.shim|gpufleet\.launch\.mpi_worker"),
    ("ray", r"\bray\b|raylet|gcs_server|dashboard\.py|log_monitor|ray::"),
    ("promtool", r"promtool"),
    ("helm", r"(^|/)helm "),
    ("go build", r"(^|/)go |/compile |/link |/asm |cgo"),
    ("image build", r"buildah|skopeo|tar |zstd|gzip|umoci"),
]
CLI = re.compile(r"gpufleet(\.cli\.main)?\s+((cluster|bench|serve)\s+\S+|\S+)")


@dataclass
class Proc:
    kind: str
    cpu: float


def comp_t(value: int) -> float:
    """A comp_t (13-bit mantissa, 3-bit base-8 exponent) in seconds."""
    return ((value & 0x1FFF) << (3 * (value >> 13))) / AHZ


def read_records(path: Path) -> list[tuple[int, int, int, int, float, str]]:
    """(pid, ppid, start s, flag, CPU s, comm) of every process that ended."""
    data = path.read_bytes()
    out = []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        flag, _v, _tty, _code, _uid, _gid, pid, ppid, btime, _et, *rest = RECORD.unpack_from(
            data, off
        )
        utime, stime, comm = rest[0], rest[1], rest[8]
        name = comm.split(b"\0", 1)[0].decode(errors="replace")
        out.append((pid, ppid, btime, flag, comp_t(utime) + comp_t(stime), name))
    return out


class Sampler:
    """Every process's command line by (pid, start second), read from /proc each second."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], str] = {}
        self.last: dict[int, str] = {}  # each pid's latest command line
        self.stop = threading.Event()
        boot = next(ln for ln in Path("/proc/stat").read_text().splitlines() if ln[:5] == "btime")
        self.boot = int(boot.split()[1])
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_bytes()
                start = self.boot + int(stat.rsplit(b")", 1)[1].split()[19]) // TICKS
                key = (int(entry.name), start)
                if key not in self.seen:
                    raw = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                    self.seen[key] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
                    self.last[key[0]] = self.seen[key]
            except (OSError, IndexError, ValueError):
                continue

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_S)

    def command(self, pid: int, start: int) -> str | None:
        """The command line of ``pid`` started at ``start`` (the record's second, from the
        monotonic clock; /proc's from the boot clock, which also counts a paused VM's time:
        they differ by a second or two, and a pid is not reused that soon)."""
        for delta in (0, -1, 1, -2, 2, -3, 3):
            if (pid, start + delta) in self.seen:
                return self.seen[(pid, start + delta)]
        return None


def kind_of(command: str | None, comm: str) -> str | None:
    """The kind a command line (else the record's name) says; None when it says none."""
    if command:
        for kind, pattern in KINDS:
            if re.search(pattern, command):
                return kind
        if cli := CLI.search(command):
            return f"gpufleet {cli.group(2)}"
        if comm.startswith("[pytest-xdist"):  # its title (setproctitle)
            return "pytest worker"
        if "python" not in comm:
            return comm
        return None
    return None if comm.startswith("python") else comm


def classify(records: list[tuple[int, int, int, int, float, str]], sampler: Sampler) -> list[Proc]:
    """Each record's kind: its own command line's, else its parent's (for a fork or a
    short-lived python), else `python (unseen)`."""
    by_pid: dict[int, str] = {}
    procs = []
    for pid, ppid, start, flag, cpu, comm in sorted(records, key=lambda r: r[2]):
        kind = kind_of(sampler.command(pid, start), comm)
        forked = bool(flag & AFORK)
        if kind is None or forked:
            parent = by_pid.get(ppid) or kind_of(sampler.last.get(ppid), "")
            kind = f"{parent} (forked)" if forked and parent else (kind or parent)
        kind = kind or f"{comm} (unseen)"
        by_pid[pid] = kind.removesuffix(" (forked)")
        procs.append(Proc(kind, cpu))
    return procs


def table(procs: list[Proc], total: float, wall: float, command: list[str]) -> str:
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for p in procs:
        cpu[p.kind] += p.cpu
        count[p.kind] += 1
    counted = sum(cpu.values())
    lines = [f"# CPU by kind of process: `{' '.join(command)}`", "",
             f"Wall {wall:.0f} s; the machine busy {total:.0f} CPU-s ({total / wall:.2f} cores); "
             f"in the processes that ended {counted:.0f} CPU-s ({len(procs)} processes).", "",
             "| kind | CPU-s | share | processes | CPU-s each |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for kind in sorted(cpu, key=lambda k: -cpu[k]):
        if cpu[kind] < 1:
            continue
        lines.append(f"| {kind} | {cpu[kind]:.0f} | {100 * cpu[kind] / total:.1f} % | "
                     f"{count[kind]} | {cpu[kind] / count[kind]:.2f} |")  # fmt: skip
    lines.append(f"| not in any record (the kernel; still running) | {total - counted:.0f} | "
                 f"{100 * (total - counted) / total:.1f} % | | |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="writes PATH.md (the table) and PATH.pacct (the records)",
    )
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    pacct = args.output.with_suffix(".pacct")
    pacct.parent.mkdir(parents=True, exist_ok=True)
    pacct.write_bytes(b"")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(pacct).encode()) != 0:
        print(f"error: acct: {os.strerror(ctypes.get_errno())} (needs root)", file=sys.stderr)
        return 2
    sampler = Sampler()
    sampler.thread.start()
    started, busy0 = time.monotonic(), machine_busy()
    proc = subprocess.Popen(args.command)
    # SIGTERM and SIGINT go to the command, and this process waits for it: the accounting the
    # kernel does for the whole machine must end with it (a default SIGTERM would leave it on)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    try:
        code = proc.wait()
    finally:
        libc.acct(None)
        sampler.stop.set()
        sampler.thread.join()
    # both above 0: the shares divide by them (a command that ended at once, on an idle machine)
    wall, total = max(time.monotonic() - started, 1e-3), max(machine_busy() - busy0, 1e-3)
    text = table(classify(read_records(pacct), sampler), total, wall, args.command)
    text += "\n" + "\n".join(environment_section(environment()))
    args.output.with_suffix(".md").write_text(text)
    print(text)
    return code if code >= 0 else 128 - code  # a signal's end as a shell reports it


if __name__ == "__main__":
    raise SystemExit(main())
