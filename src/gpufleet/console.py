"""Where gpufleet's commands write: notes and errors on stderr (``err_console``), results on
stdout as a table or one strict JSON object (``print_json``). The CLI and the benchmarks both
print through these, so stdout holds only what a script reads."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

from rich.console import Console

# markup=False: what is printed holds user text (a job named "[/x]", a field "[a]"), which rich
# would read as markup and fail on (MarkupError) or swallow; styles come as Text spans instead.
err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def strict_json(data: Any) -> Any:
    """``data`` with every NaN or infinite float replaced by None: strict JSON has no NaN,
    and parsers other than Python's refuse Python's bare ``NaN``."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict_json(v) for v in data]
    return data


def camel_json(item: Any) -> Any:
    """A dataclass (or what it holds) as JSON with camelCase keys, as the API's objects have."""

    def camel(key: str) -> str:
        head, *rest = key.split("_")
        return head + "".join(part.title() for part in rest)

    def convert(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, dict):
            return {camel(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        return value

    return convert(item)


def print_json(data: Any) -> None:
    """One JSON object on stdout (strict JSON: ``null`` for NaN or Inf)."""
    sys.stdout.write(json.dumps(strict_json(data), sort_keys=True, allow_nan=False) + "\n")
    sys.stdout.flush()
