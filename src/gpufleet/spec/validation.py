"""What every spec object shares: the base model, the bounds and unit-parsing types of its
fields, and the plumbing that reports cross-field rules together with the fields' own errors."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from gpufleet.spec.units import parse_duration, parse_quantity

Duration = Annotated[float, BeforeValidator(parse_duration)]
Quantity = Annotated[str, BeforeValidator(parse_quantity)]


# Bounds of numbers that end up in Kubernetes objects (int32 fields such as backoffLimit and
# replicas; an Indexed Job has at most 100000 completions) or in a worker's command line.
INT32_MAX = 2**31 - 1
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024  # torchrun's --nproc-per-node; the largest GPU servers have 16
MAX_BATCH = 1 << 20  # samples per step per process


class SpecModel(BaseModel):
    """Base of every spec object: camelCase keys, unknown fields rejected, strict types."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        strict=True,
        frozen=True,
        # Built on first use, not at import: a command that reads no spec (status, logs,
        # cancel) saves building every model's validator (about 0.2 CPU-s).
        defer_build=True,
    )


Loc = tuple[str | int, ...]
CROSS_FIELD = "cross_field"  # the pydantic error type of a cross-field problem
Problem = tuple[Loc, str]  # (path under the model, as keys are written; what is wrong)


def raw_int(data: dict[str, Any], *path: str, default: int, minimum: int = 0) -> int | None:
    """The integer at ``path`` in a raw document (``default`` when absent); None when it is not
    a valid integer there, which the field's own validation reports."""
    value: Any = data
    for key in path:
        if not isinstance(value, dict):
            return None  # not a mapping where one belongs: its field error says so
        if key not in value:
            return default
        value = value[key]
    if type(value) is not int or value < minimum:
        return None
    return value


class CrossFieldModel(SpecModel):
    """A spec object with rules across its fields (Kueue's field.ErrorList habit): each rule
    yields one problem at its own path, and the rules read the raw document, so they run and are
    reported together with the fields' own errors even when some field is invalid."""

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        """Problems across fields of the raw ``data`` (keys as written); none by default."""
        return []

    @model_validator(mode="wrap")
    @classmethod
    def _cross_field_rules(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        problems = cls.cross_field_problems(data) if isinstance(data, dict) else []
        try:
            model = handler(data)
        except ValidationError as exc:
            if not problems:
                raise
            raise _errors(exc.title, exc.errors(), problems, data) from None
        if problems:
            raise _errors(cls.__name__, [], problems, data)
        return model


_PYDANTIC_ERRORS = frozenset(get_args(ErrorType))


def _errors(title: str, field_errors: Any, problems: list[Problem], data: Any) -> ValidationError:
    details: list[InitErrorDetails] = [
        {
            # A custom error (a nested model's cross-field one, an env value's) is re-created
            # with its words; pydantic's own types are named.
            "type": e["type"]
            if e["type"] in _PYDANTIC_ERRORS
            else PydanticCustomError(e["type"], e["msg"]),
            "loc": e["loc"],
            "input": e["input"],
            "ctx": e.get("ctx", {}),
        }
        for e in field_errors
    ]
    for loc, message in problems:
        value = data
        for key in loc:
            value = value.get(key) if isinstance(value, dict) else None
        details.append(
            {"type": PydanticCustomError(CROSS_FIELD, message), "loc": loc, "input": value}
        )
    return ValidationError.from_exception_data(title, details)
