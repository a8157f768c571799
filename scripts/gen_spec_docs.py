"""Generate docs/spec.md from the spec models; ``--check`` fails if the checked-in file differs.

python scripts/gen_spec_docs.py          # write docs/spec.md
python scripts/gen_spec_docs.py --check  # CI: the doc matches the models
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gpufleet.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_HUNG,
    EXIT_NO_CHECKPOINT,
    EXIT_NON_FINITE,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_STORAGE,
)
from gpufleet.spec import InferenceService, TrainingJob

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec.md"

HEADER = """# Spec reference

Generated from `gpufleet.spec` by `scripts/gen_spec_docs.py`; `make lint` checks that it is
current. Two kinds: `TrainingJob` (run locally or rendered for Kubernetes) and
`InferenceService` (a Triton model repository served on Kubernetes). Every object rejects
unknown fields, and `gpufleet validate FILE` reports every error with its field path (and YAML
line). Override any field from the command line with
`--set path=value`, for example `--set spec.nodes=2 --set spec.env.MODE=fast`.

Durations take seconds (`30`) or units (`45s`, `5m`, `1h30m`, `250ms`, `500us`). Quantities are
Kubernetes quantities (`2`, `500m`, `4Gi`). *Cluster only* fields are validated everywhere and
ignored by `gpufleet run` with a one-line note.
"""

EXIT_MEANINGS = [
    (EXIT_OK, "the job succeeded"),
    (EXIT_FAILED, "the job failed: a worker failed after `spec.maxRestarts` restarts, or the "
     "job is already running"),
    (EXIT_BAD_INPUT, "bad input: the spec or the command line (nothing was started), or the "
     "checkpoint directory holds another job's or model's checkpoints"),
    (EXIT_HUNG, "(a worker's own code) its hang watchdog fired; the launcher restarts the group"),
    (EXIT_NO_CHECKPOINT, "no usable checkpoint: every complete one failed its checksums (set "
     "aside); no restart"),
    (EXIT_NON_FINITE, "the loss or weights became NaN/Inf; stopped before checkpointing them; "
     "no restart"),
    (EXIT_STORAGE, "checkpoint storage full or refused (ENOSPC, EDQUOT, EROFS, EACCES, EPERM); "
     "no restart"),
    (EXIT_PREEMPTED, "preempted after a checkpoint (SIGTERM/SIGINT), or (a pod) its rendezvous "
     "host was lost; run again to resume"),
    ("128+N", "stopped by signal N before a preemption checkpoint was confirmed"),
]  # fmt: skip
EXIT_CODES = "\n## Exit codes\n\n| code | meaning |\n| --- | --- |\n" + "".join(
    f"| {code} | {meaning} |\n" for code, meaning in EXIT_MEANINGS
)


def type_name(annotation: object) -> str:
    """A readable type: int, string, duration, list of Volume, ..."""
    if annotation is None or annotation is type(None):
        return "null"
    meta = getattr(annotation, "__metadata__", ())
    for m in meta:
        func = getattr(getattr(m, "func", None), "__name__", "")
        if func == "parse_duration":
            return "duration"
        if func == "parse_quantity":
            return "quantity"
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        annotation,  # type: ignore[call-overload]
        str(annotation),
    )


def field_type(field: FieldInfo) -> str:
    """The field's type; pydantic keeps Annotated validators in ``field.metadata``."""
    for m in field.metadata:
        func = getattr(getattr(m, "func", None), "__name__", "")
        if func in ("parse_duration", "parse_quantity"):
            return func.removeprefix("parse_")
    return type_name(field.annotation)


def default_of(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(object defaults)"
        return f"`{value!r}`" if value not in ({}, []) else "empty"
    if field.default is None or field.default is PydanticUndefined:
        return "unset"
    return f"`{field.default!r}`".replace("True", "true").replace("False", "false")


def models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += models_in(arg)
    return out


def render() -> str:
    sections: list[str] = [HEADER]
    seen: set[type[BaseModel]] = set()
    queue: list[type[BaseModel]] = [TrainingJob, InferenceService]
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        doc = (model.__doc__ or "").strip().splitlines()[0]
        rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            rows.append(
                f"| `{key}` | {field_type(field)} | {default_of(field)} | "
                f"{field.description or ''} |"
            )
            queue += [m for m in models_in(field.annotation) if m not in seen]
        sections.append(f"## {model.__name__}\n\n{doc}\n\n" + "\n".join(rows) + "\n")
    sections.append(EXIT_CODES)
    return "\n".join(sections)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="fail if docs/spec.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
