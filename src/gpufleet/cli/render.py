"""``gpufleet render FILE``: the Kubernetes objects of a job, as YAML (a dry run of submit)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from gpufleet.cli.common import fail, load_any
from gpufleet.cli.validate import SetOption
from gpufleet.console import err_console
from gpufleet.errors import FieldError, UserInputError
from gpufleet.launch.worker import missing_script
from gpufleet.render import SERVING_TARGETS, TARGETS, Obj, render_spec, targets_for
from gpufleet.spec import Spec, TrainingJob

TargetOption = Annotated[
    str | None,
    typer.Option(
        help=f"What runs it on the cluster. TrainingJob: {', '.join(TARGETS)} (default job); "
        f"InferenceService: {', '.join(SERVING_TARGETS)} (default triton)."
    ),
]


def load_and_render(
    file: str, target: str | None, set_: list[str] | None
) -> tuple[Spec, list[Obj]]:
    """The spec in ``file`` and its objects for ``target``; exit 2 with field paths if not."""
    spec = load_any(file, set_)
    known = TARGETS if isinstance(spec, TrainingJob) else SERVING_TARGETS
    if target is not None and target not in known:  # a known one: render() says what runs it
        allowed = targets_for(spec)
        msg = f"unknown target {target!r} for a {spec.kind}; choose one of: {', '.join(allowed)}"
        fail(UserInputError([FieldError("--target", msg)], file))
    try:
        objects = render_spec(spec, target)
    except UserInputError as exc:
        fail(UserInputError(exc.errors, file))
    if isinstance(spec, TrainingJob):
        for warning in spec.spec.env_warnings():
            err_console.print(warning)
        if missing := missing_script(spec):
            # Not an error here: the image may hold the script (an error for `gpufleet run`).
            note = "the image must hold it (pods run it from the container's working directory)"
            err_console.print(f"warning: spec.command[0]: {missing}; {note}")
    return spec, objects


def render_cmd(
    file: Annotated[str, typer.Argument(help="A TrainingJob or InferenceService YAML file.")],
    target: TargetOption = None,
    set_: SetOption = None,
    out: Annotated[
        Path | None, typer.Option(help="Write one file per object here instead of stdout.")
    ] = None,
) -> None:
    """Render a spec's Kubernetes objects; exit 2 with field paths if it cannot run there."""
    _, objects = load_and_render(file, target, set_)
    if out is None:
        yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for i, obj in enumerate(objects):
        path = out / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
        err_console.print(f"wrote {path}")
