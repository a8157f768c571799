"""Load a spec file: YAML with line numbers, ``--set`` overrides, every error with its path."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec.inference import InferenceService
from gpufleet.spec.training import TrainingJob
from gpufleet.spec.validation import CROSS_FIELD
from gpufleet.spec.workloads import WORKLOAD_KINDS

PathKey = tuple[str | int, ...]

# Tags of discriminated unions; pydantic puts them in error locations, users never write them.
_UNION_TAGS = frozenset(WORKLOAD_KINDS)


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
        with path.open("rb") as file:  # never more than the bound: a spec of /dev/zero ends
            raw = file.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise UserInputError([FieldError("", "file not found")], str(path)) from None
    except IsADirectoryError:
        raise UserInputError([FieldError("", "is a directory, not a file")], str(path)) from None
    except OSError as exc:
        msg = f"cannot read file: {exc.strerror or exc}"
        raise UserInputError([FieldError("", msg)], str(path)) from None
    if len(raw) > MAX_SPEC_BYTES:
        _too_large(str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"not UTF-8 text (byte {exc.start})"
        raise UserInputError([FieldError("", msg)], str(path)) from None


def parse_yaml(text: str, source: str | None = None) -> tuple[object, dict[PathKey, int | None]]:
    """Parse one YAML document; return the data and a map from field path to 1-based line.

    Hostile input is refused before it costs time or memory (exit 2 in well under a second):
    documents above MAX_SPEC_BYTES, and more than MAX_SPEC_NODES nodes once aliases are
    expanded (a "billion laughs" file of a few hundred bytes expands to gigabytes in whatever
    walks the data next). The Kubernetes API server bounds the same two things since
    CVE-2019-11253. Duplicate keys are errors: YAML would keep only the last one, silently.
    """
    if len(text.encode()) > MAX_SPEC_BYTES:
        _too_large(source)
    loader = _Loader(text)
    try:
        # A second parse, on purpose: the C composer builds a whole document before Python
        # sees it, so the bound is checked on the lazy event stream first (a 3 MiB text at
        # most: parsing it twice costs well under a second).
        _check_expansion(text, source)
        docs: list[yaml.Node] = []
        while loader.check_node():
            if (node := loader.get_node()) is not None:
                docs.append(node)
        if len(docs) != 1:
            what = "is empty" if not docs else f"holds {len(docs)} YAML documents; expected one"
            raise UserInputError([FieldError("", what)], source)
        lines: dict[PathKey, int | None] = {}
        duplicates: list[FieldError] = []
        _index_lines(docs[0], (), lines, duplicates, set())
        if duplicates:
            raise UserInputError(duplicates, source)
        data = loader.construct_document(docs[0])
    except yaml.YAMLError as exc:
        line = None
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            line = mark.line + 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserInputError([FieldError("", f"not valid YAML: {problem}", line)], source) from None
    except (ValueError, RecursionError) as exc:  # e.g. NUL bytes, absurd nesting
        raise UserInputError([FieldError("", f"not valid YAML: {exc}")], source) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        got = type(data).__name__
        msg = f"expected a mapping with apiVersion, kind, metadata and spec, got {got}"
        raise UserInputError([FieldError("", msg, 1)], source)
    return data, lines


# The C parser when PyYAML has it (it is ten times faster); the same safe constructor either way.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Bounds on a spec file. A real one has hundreds of nodes; these leave room for thousands of
# environment variables while keeping the worst case well under a second.
MAX_SPEC_BYTES = 3 * 1024 * 1024
MAX_SPEC_NODES = 50_000
# How deep a document may nest. Past it PyYAML's recursive constructor (and pydantic) would
# hit Python's recursion limit; no spec nests more than a dozen levels.
MAX_SPEC_DEPTH = 100


def _too_large(source: str | None) -> NoReturn:
    _bound_error(f"is larger than {MAX_SPEC_BYTES:,} bytes, the most a spec may be (the "
                 "Kubernetes API server's request limit)", source)  # fmt: skip


def _bound_error(message: str, source: str | None, line: int | None = None) -> NoReturn:
    raise UserInputError([FieldError("", message, line)], source)


def _check_expansion(text: str, source: str | None) -> None:
    """Count the nodes of ``text`` with aliases expanded, from the parser's events (lazy: a
    bomb stops being read at the bound), and refuse too many, too deep, or an alias inside
    the node it names (a recursive structure no spec is)."""
    total = 0
    sizes: dict[str, int] = {}  # anchor -> expanded size of its node
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, total when it opened)
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            total += 1
            open_nodes.append((event.anchor, total))
            if len(open_nodes) > MAX_SPEC_DEPTH:
                _bound_error(f"nests deeper than {MAX_SPEC_DEPTH} levels", source, line)
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, opened = open_nodes.pop()
            if anchor:
                sizes[anchor] = total - opened + 1
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_nodes):
                _bound_error(f"alias *{event.anchor} is inside the node it refers to (a "
                             "recursive structure)", source, line)  # fmt: skip
            total += sizes.get(event.anchor or "", 1)  # unknown: the composer reports it
        if total > MAX_SPEC_NODES:
            what = f"has more than {MAX_SPEC_NODES:,} YAML nodes with its aliases expanded"
            _bound_error(f"{what}; a spec this large is a mistake or an alias bomb", source, line)


def _index_lines(
    node: yaml.Node,
    path: PathKey,
    out: dict[PathKey, int | None],
    duplicates: list[FieldError],
    seen: set[int],
) -> None:
    """Record the line of every path, and duplicate keys. A node reached again through an alias
    is not walked again: its paths take the alias's line (the nearest recorded parent)."""
    out[path] = node.start_mark.line + 1
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key == "<<" and key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge key: its keys may be overridden, as YAML defines
            child = (*path, key)
            if key in first:
                duplicates.append(FieldError(_format_path(child), (
                    f"duplicate key (lines {first[key]} and {line}): YAML keeps only the last "
                    "value; remove one"), line))  # fmt: skip
                continue
            first[key] = line
            out[child] = line
            _index_lines(value_node, child, out, duplicates, seen)
            out[child] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, i), out, duplicates, seen)


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
        if part in ("value", "valueFrom") and i > 1 and loc[i - 2] == "env":
            continue  # the tag of an env entry's kind (spec.env.NAME)
        # pydantic's own steps: validators, and "[key]" under a dict key that failed
        if isinstance(part, str) and (part.startswith("function-") or part == "[key]"):
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
