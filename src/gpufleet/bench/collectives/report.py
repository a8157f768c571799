"""What ``gpufleet bench collectives`` shows: the table, the plot, the JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.bench.collectives.ops import Row, human_bytes
from gpufleet.errors import EXIT_FAILED

HEADER = (
    f"{'op':<15}{'mode':<13}{'size':>10}{'count':>12}{'time us':>12}{'algbw GB/s':>12}"
    f"{'busbw GB/s':>12}  check"
)


def format_row(r: Row) -> str:
    """One line of the table."""
    return (
        f"{r.op:<15}{r.mode:<13}{human_bytes(r.bytes):>10}{r.count:>12}"
        f"{r.seconds * 1e6:>12.1f}{r.algbw_gbps:>12.3f}{r.busbw_gbps:>12.3f}  "
        f"{'ok' if r.correct else 'WRONG'}"
    )


def plot(rows: list[Row], path: Path, title: str) -> None:
    """Bus bandwidth against size, one line per (op, mode), log-log: the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    keys = sorted({(r.op, r.mode) for r in rows})
    for op, mode in keys:
        mine = [r for r in rows if (r.op, r.mode) == (op, mode)]
        ax.plot(
            [r.bytes for r in mine],
            [r.busbw_gbps for r in mine],
            marker="o",
            markersize=3,
            label=f"{op} ({mode})",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(data: dict[str, Any], outdir: Path, as_json: bool) -> int:
    """A run's result with this machine's description: written to ``outdir`` (JSON, plot),
    then shown; the exit code."""
    from gpufleet.bench import runner
    from gpufleet.bench.system import describe

    rows = [Row(**r) for r in data["rows"]]
    result = {**data, "system": describe()}
    title = f"busbw, {data['ranks']} ranks, {data['backend']}"
    runner.write_result(outdir, "collectives", result, lambda png: plot(rows, png, title))
    if not as_json:
        runner.say(f"results: {outdir}/collectives.json, collectives.png")
    return show(result, as_json)


def show(data: dict[str, Any], as_json: bool) -> int:
    """The table or the JSON; the exit code: 1 if any result was wrong."""
    from gpufleet.bench import runner

    rows = [Row(**r) for r in data["rows"]]
    if as_json:
        runner.print_json(data)
    else:
        print(HEADER)
        for row in rows:
            print(format_row(row))
    if not all(r.correct for r in rows):
        wrong = sum(not r.correct for r in rows)
        runner.say(f"error: {wrong} result(s) were wrong")
        return EXIT_FAILED
    return 0
