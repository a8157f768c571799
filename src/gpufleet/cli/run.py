"""``gpufleet run FILE``: run a job on this machine; again to resume it."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from gpufleet.cli.common import Output, RunRootOption, load_job
from gpufleet.cli.validate import SetOption
from gpufleet.console import err_console, print_json
from gpufleet.launch.worker import DEFAULT_RUN_ROOT
from gpufleet.runtime.files import read_json
from gpufleet.runtime.rundir import RunDir

if TYPE_CHECKING:
    from gpufleet.launch.local import RunSummary


def run(
    file: Annotated[str, typer.Argument(help="A TrainingJob YAML file.")],
    set_: SetOption = None,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="text, or json: one summary object on stdout")
    ] = Output.text,
    fresh: Annotated[
        bool, typer.Option(help="Start over: move the old run directory aside instead of resuming.")
    ] = False,
    run_root: RunRootOption = DEFAULT_RUN_ROOT,
) -> None:
    """Run a TrainingJob locally with PyTorch's elastic launcher.

    Exit codes: 0 succeeded, 1 failed (or the job is already running), 2 bad input, 4 no
    usable checkpoint, 5 NaN/Inf loss, 6 checkpoint storage full or refused, 75 preempted after
    a checkpoint (run again to resume), 128+N stopped by signal N before a checkpoint was
    confirmed.
    """
    from gpufleet.launch.local import run_local  # imports torch: only when a job runs

    job = load_job(file, set_)  # spec.checkpoint.dir resolved: cli.common.resolve_checkpoint_dir
    total = job.spec.workload.steps if job.spec.workload else None
    run_dir = run_root / job.metadata.name
    if output is Output.json:
        # Workers' prefixed output goes to stderr so stdout holds only the JSON summary.
        with contextlib.redirect_stdout(sys.stderr):
            summary = run_local(job, run_root=run_root, fresh=fresh)
        print_json(summary.to_json())
    else:
        with _progress(run_dir, total):
            summary = run_local(job, run_root=run_root, fresh=fresh)
        _print_summary(summary)
    raise typer.Exit(summary.exit_code)


@contextlib.contextmanager
def _progress(run_dir: Path, total: int | None) -> Iterator[None]:
    """A progress bar (step, loss, samples/s) fed by rank 0's progress.json, on a terminal."""
    console = Console(markup=False)
    if total is None or not console.is_terminal:
        yield
        return
    bar = Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[sps]} samples/s"),
        TimeElapsedColumn(),
        console=console,
        redirect_stdout=True,
        redirect_stderr=True,
    )
    task = bar.add_task("train", total=total, loss="-", sps="-")
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.25):
            p = read_json(RunDir(run_dir).progress)
            if p:
                bar.update(
                    task,
                    completed=p["step"],
                    loss=f"{p['loss']:.4f}",
                    sps=f"{p['samples_per_second']:,.0f}",
                )

    thread = threading.Thread(target=poll, daemon=True)
    with bar:
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


def _print_summary(s: RunSummary) -> None:
    color = {"Succeeded": "green", "Preempted": "yellow"}.get(s.status, "red")
    # A Text title: err_console prints without markup (names are user input), so markup tags
    # in a plain string would show as they are.
    title = Text.assemble(f"{s.name}: ", (s.status, color))
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    rows = [
        ("steps", s.steps),
        ("final loss", None if s.final_loss is None else f"{s.final_loss:.4f}"),
        ("test accuracy", None if s.accuracy is None else f"{s.accuracy:.2%}"),
        ("restarts", s.restarts),
        ("launches", s.launches),
        ("resumed from step", s.resumed_from),
        ("wall time", f"{s.wall_seconds:.1f}s"),
        ("samples/s", None if s.samples_per_second is None else f"{s.samples_per_second:,.0f}"),
        ("global batch", None if "global_batch" not in s.extra else int(s.extra["global_batch"])),
        ("checkpoint", s.checkpoint),
        ("state digest", s.state_digest),
        ("run dir", s.run_dir),
    ]
    for key, value in rows:
        if value is not None:
            table.add_row(key, str(value))
    err_console.print(table)
    if s.message:
        err_console.print(s.message, markup=False)
