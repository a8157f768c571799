"""``gpufleet checkpoints verify DIR|URI``: every checkpoint checked against its checksums."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufleet.cli.common import Output, fail
from gpufleet.console import print_json
from gpufleet.errors import EXIT_FAILED, FieldError, UserInputError
from gpufleet.runtime import integrity
from gpufleet.runtime.context import CHECKPOINTS_DIR

checkpoints = typer.Typer(help="Checkpoints: list and verify them.", no_args_is_help=True)


def _filesystem(location: str) -> tuple[Any, str]:
    import fsspec

    if "://" not in location or location.startswith("file://"):
        path = Path(location.removeprefix("file://"))
        if not path.is_dir():
            raise UserInputError([FieldError("LOCATION", f"{location}: no such directory")])
        if (path / CHECKPOINTS_DIR).is_dir():  # a run directory
            path = path / CHECKPOINTS_DIR
        return fsspec.filesystem("file"), str(path.resolve())
    try:
        fs, root = fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as exc:
        raise UserInputError([FieldError("LOCATION", f"{location}: {exc}")]) from exc
    return fs, str(root)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@checkpoints.command()
def verify(
    location: Annotated[
        str,
        typer.Argument(help="A checkpoint directory, a run directory or a URI (s3://b/p)."),
    ],
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json")] = Output.text,
) -> None:
    """List every checkpoint with its step, size, world size and OK / CORRUPT / TORN
    (UNVERIFIED: written before checksums), reading every file. Exits 1 when the newest one
    is unusable (corrupt or torn) or there is none."""
    try:
        fs, root = _filesystem(location)
        entries = integrity.survey(fs, root)
    except UserInputError as exc:
        fail(exc)
    except OSError as exc:  # storage that cannot be read (credentials, network)
        fail(UserInputError([FieldError("LOCATION", f"{location}: {exc}")]))
    unusable = not entries or entries[-1].status in ("CORRUPT", "TORN")
    if output is Output.json:
        print_json({
            "location": location,
            "newest_usable": not unusable,
            "checkpoints": [
                {"step": e.step, "path": e.path, "status": e.status, "bytes": e.size,
                 "world_size": e.world_size, "problems": [str(p) for p in e.problems]}
                for e in entries
            ],
        })  # fmt: skip
    elif not entries:
        Console(stderr=True).print(f"no checkpoint in {location}", markup=False)
    else:
        table = Table("step", "status", "size", "world size", "path", box=None)
        for e in entries:  # Text: a path is never read as rich markup
            cells = (str(e.step), e.status, _size(e.size), str(e.world_size or "-"), e.path)
            table.add_row(*map(Text, cells))
        console = Console(highlight=False, soft_wrap=True, markup=False)
        console.print(table)
        for e in entries:
            for problem in e.problems:
                console.print(Text(f"step {e.step}: {problem}"))
    if unusable:
        raise typer.Exit(EXIT_FAILED)
