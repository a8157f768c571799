"""A job's environment: variable names, and values kept out of the spec in a Secret or ConfigMap
(Kubernetes' valueFrom and envFrom)."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import Discriminator, Field, Tag

from gpufleet.spec.names import ObjectRefName
from gpufleet.spec.validation import CrossFieldModel, Problem, SpecModel

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an environment variable's name
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")  # a Secret's or ConfigMap's data key


class KeyRef(SpecModel):
    """One key of a Secret or ConfigMap, as Kubernetes' secretKeyRef/configMapKeyRef."""

    name: ObjectRefName = Field(description="The Secret's or ConfigMap's name.")
    key: str = Field(pattern=_CONFIG_KEY.pattern, description="The key in its data.")
    optional: bool = Field(default=False, description="Unset, not an error, when missing.")


class _OneOfTwo(CrossFieldModel):
    """A Kubernetes source of exactly one of two kinds (a Secret's or a ConfigMap's)."""

    KINDS: ClassVar[tuple[str, str]]  # the two fields, as written

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        if sum(data.get(k) is not None for k in cls.KINDS) != 1:
            return [((), f"set exactly one of {cls.KINDS[0]} or {cls.KINDS[1]}")]
        return []

    @property
    def ref(self) -> tuple[str, Any]:
        """(the kind as written, e.g. "secretKeyRef"; the reference)."""
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if info.alias in self.KINDS and value is not None:
                return info.alias, value
        raise AssertionError("validation ensures one kind is set")


class EnvSource(_OneOfTwo):
    """An environment value kept out of the spec: exactly one of the two references."""

    KINDS = ("secretKeyRef", "configMapKeyRef")
    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")


class NameRef(SpecModel):
    """A whole Secret or ConfigMap."""

    name: ObjectRefName = Field(description="The Secret's or ConfigMap's name.")
    optional: bool = Field(default=False, description="Nothing, not an error, when missing.")


class EnvFromSource(_OneOfTwo):
    """Every key of a Secret or ConfigMap as an environment variable, as Kubernetes' envFrom."""

    KINDS = ("secretRef", "configMapRef")
    secret_ref: NameRef | None = Field(default=None, description="A Secret.")
    config_map_ref: NameRef | None = Field(default=None, description="A ConfigMap.")
    prefix: str | None = Field(
        default=None, pattern=ENV_NAME.pattern, description="Prepended to each key."
    )


def _env_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "value"
    if isinstance(value, dict | EnvSource):
        return "valueFrom"
    return None


# An env entry: a plain string, or {secretKeyRef: ...} / {configMapKeyRef: ...}.
EnvValue = Annotated[
    Annotated[str, Tag("value")] | Annotated[EnvSource, Tag("valueFrom")],
    Discriminator(
        _env_kind,
        custom_error_type="env_value",
        custom_error_message=(
            "must be a string, or {secretKeyRef: {name, key}} or {configMapKeyRef: {name, key}}"
        ),
    ),
]
# Variable names whose plain values are credentials: they belong in a Secret.
CREDENTIAL_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE
)
