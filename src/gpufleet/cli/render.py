"""``gpufleet render FILE``: the Kubernetes objects of a job, as YAML (a dry run of submit)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from gpufleet.cli.common import err_console, fail, load_job
from gpufleet.cli.validate import SetOption
from gpufleet.errors import FieldError, UserInputError
from gpufleet.render import TARGETS, Obj, render
from gpufleet.spec.models import TrainingJob

TargetOption = Annotated[
    str, typer.Option(help=f"What runs the job on the cluster: {', '.join(TARGETS)}.")
]


def load_and_render(
    file: str, target: str, set_: list[str] | None
) -> tuple[TrainingJob, list[Obj]]:
    """The spec in ``file`` and its objects for ``target``; exit 2 with field paths if not."""
    if target not in TARGETS:
        msg = f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}"
        fail(UserInputError([FieldError("--target", msg)], file))
    job = load_job(file, set_)
    try:
        return job, render(job, target)
    except UserInputError as exc:
        fail(UserInputError(exc.errors, file))


def render_cmd(
    file: Annotated[str, typer.Argument(help="A TrainingJob YAML file.")],
    target: TargetOption = "job",
    set_: SetOption = None,
    out: Annotated[
        Path | None, typer.Option(help="Write one file per object here instead of stdout.")
    ] = None,
) -> None:
    """Render a job's Kubernetes objects; exit 2 with field paths if it cannot run there."""
    _, objects = load_and_render(file, target, set_)
    if out is None:
        yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for i, obj in enumerate(objects):
        path = out / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
        err_console.print(f"wrote {path}")
