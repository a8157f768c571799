"""Load a spec file: YAML with line numbers, ``--set`` overrides, every error with its path."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec.inference import InferenceService
from gpufleet.spec.models import CROSS_FIELD, TrainingJob

PathKey = tuple[str | int, ...]

# Tags of discriminated unions; pydantic puts them in error locations, users never write them.
_UNION_TAGS = frozenset({"digits", "synthetic"})


Spec = TrainingJob | InferenceService


def load_training_job(path: str | Path, overrides: list[str] | None = None) -> TrainingJob:
    """Read, override and validate a TrainingJob file. Raises UserInputError with every problem."""
    spec = load_spec(path, overrides)
    if not isinstance(spec, TrainingJob):
        raise UserInputError([FieldError("kind", "expected a TrainingJob here")], str(path))
    return spec


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Spec:
    """Read, override and validate a spec file of any kind (TrainingJob, InferenceService)."""
    source = str(path)
    text = _read_text(Path(path))
    data, lines = parse_yaml(text, source)
    for override in overrides or []:
        key, value = parse_override(override)
        _apply_override(data, key, value, source)
        lines[key] = None  # the value now comes from the command line, not the file
    return validate_spec(data, source, lines)


def validate_training_job(
    data: object, source: str | None = None, lines: dict[PathKey, int | None] | None = None
) -> TrainingJob:
    """Validate an already-parsed document; errors carry field paths (and lines when given)."""
    return _validate(TrainingJob, data, source, lines)


def validate_spec(
    data: object, source: str | None = None, lines: dict[PathKey, int | None] | None = None
) -> Spec:
    """Validate a document as the kind it names (a TrainingJob unless it says otherwise)."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "InferenceService":
        return _validate(InferenceService, data, source, lines)
    return _validate(TrainingJob, data, source, lines)


M = TypeVar("M", bound=BaseModel)


def _validate(
    model: type[M], data: object, source: str | None, lines: dict[PathKey, int | None] | None
) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [_field_error(model, err, lines or {}) for err in exc.errors()]
        raise UserInputError(errors, source) from None


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserInputError([FieldError("", "file not found")], str(path)) from None
    except IsADirectoryError:
        raise UserInputError([FieldError("", "is a directory, not a file")], str(path)) from None
    except OSError as exc:
        msg = f"cannot read file: {exc.strerror or exc}"
        raise UserInputError([FieldError("", msg)], str(path)) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"not UTF-8 text (byte {exc.start})"
        raise UserInputError([FieldError("", msg)], str(path)) from None


def parse_yaml(text: str, source: str | None = None) -> tuple[object, dict[PathKey, int | None]]:
    """Parse one YAML document; return the data and a map from field path to 1-based line."""
    try:
        docs = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        line = None
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            line = mark.line + 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserInputError([FieldError("", f"not valid YAML: {problem}", line)], source) from None
    except (ValueError, RecursionError) as exc:  # e.g. NUL bytes, absurd nesting
        raise UserInputError([FieldError("", f"not valid YAML: {exc}")], source) from None
    docs = [d for d in docs if d is not None]
    if len(docs) != 1:
        what = "is empty" if not docs else f"holds {len(docs)} YAML documents; expected one"
        raise UserInputError([FieldError("", what)], source)
    lines: dict[PathKey, int | None] = {}
    _index_lines(docs[0], (), lines)
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # constructor errors
        raise UserInputError([FieldError("", f"not valid YAML: {exc}")], source) from None
    if not isinstance(data, dict):
        got = type(data).__name__
        msg = f"expected a mapping with apiVersion, kind, metadata and spec, got {got}"
        raise UserInputError([FieldError("", msg, 1)], source)
    return data, lines


def _index_lines(node: yaml.Node, path: PathKey, out: dict[PathKey, int | None]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                child = (*path, str(key_node.value))
                out[child] = key_node.start_mark.line + 1
                _index_lines(value_node, child, out)
                out[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, i), out)


def parse_override(text: str) -> tuple[PathKey, object]:
    """Parse ``spec.nodes=2`` or ``spec.command[1]=x`` into a key path and a YAML value."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserInputError([FieldError("--set", f"expected key=value, got {text!r}")])
    parts: list[str | int] = []
    for piece in key.strip().split("."):
        name, _, rest = piece.partition("[")
        if not name:
            raise UserInputError([FieldError("--set", f"bad key {key!r}")])
        parts.append(name)
        while rest:
            index, close, rest = rest.partition("]")
            if not close or not index.isdigit() or (rest and not rest.startswith("[")):
                raise UserInputError([FieldError("--set", f"bad index in key {key!r}")])
            parts.append(int(index))
            rest = rest[1:]
    if tuple(parts[:2]) == ("spec", "env"):
        return tuple(parts), raw  # environment values are strings; don't let YAML retype them
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return tuple(parts), value


def _apply_override(data: object, key: PathKey, value: object, source: str) -> None:
    node: Any = data
    for i, part in enumerate(key):
        last = i == len(key) - 1
        where = _format_path(key[: i + 1])
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                msg = "no such list item to override"
                raise UserInputError([FieldError(where, f"--set: {msg}")], source)
        elif not isinstance(node, dict):
            raise UserInputError([FieldError(where, "--set: parent is not a mapping")], source)
        if last:
            node[part] = value
        else:
            if isinstance(part, str) and part not in node:
                node[part] = {}
            node = node[part]


def _format_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _clean_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    cleaned: list[str | int] = []
    for i, part in enumerate(loc):
        if part in _UNION_TAGS and i > 0 and loc[i - 1] == "workload":
            continue
        if isinstance(part, str) and part.startswith(("function-", "[")):
            continue
        cleaned.append(part)
    return tuple(cleaned)


def _field_error(model: type[BaseModel], err: Any, lines: dict[PathKey, int | None]) -> FieldError:
    """One pydantic error of validating ``model`` as a FieldError: path, plain message, line."""
    loc = _clean_loc(tuple(err["loc"]))
    message = str(err["msg"])
    kind = err["type"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif kind == "extra_forbidden":
        message = "unknown field" + _suggest(model, loc)
    elif kind == "missing":
        message = "required field is missing"
    elif kind == CROSS_FIELD:
        pass  # the rule's own words; the value is the user's, at the path shown
    elif kind in ("literal_error", "union_tag_invalid"):
        message = message + f", got {err.get('input')!r}"
    elif "input" in err and kind not in ("model_type", "dict_type"):
        message = f"{message}, got {_short(err['input'])}"
    line = None
    for n in range(len(loc), -1, -1):
        found = lines.get(loc[:n])
        if found is not None or loc[:n] in lines:
            line = found
            break
    return FieldError(_format_path(loc), message, line)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _suggest(kind: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    """'; did you mean ...?' and the allowed names, from the model of the kind being loaded."""
    model = _model_at(kind, loc[:-1])
    if model is None or not loc or not isinstance(loc[-1], str):
        return ""
    names = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(loc[-1], names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (allowed: {', '.join(names)})"


def _model_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = next(
            (f for n, f in current.model_fields.items() if (f.alias or n) == part),
            None,
        )
        if field is None:
            return None
        found = _first_model(field.annotation)
        if found is None:
            return None
        current = found
    return current


def _first_model(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _first_model(arg)
        if found is not None:
            return found
    return None
