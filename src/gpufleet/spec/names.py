"""Kubernetes' rules for the names and labels a spec carries, and a job's identity (apiVersion,
metadata)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from gpufleet.spec.validation import SpecModel

API_VERSION = "gpufleet.dev/v1alpha1"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # also a key's name
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _kubernetes_name(
    pattern: re.Pattern[str], what: str, ends: str = "starting and ending with a letter or digit"
) -> AfterValidator:
    """A validator for a Kubernetes name or label value: at most 63 characters of ``what``."""

    def check(value: str) -> str:
        if len(value) > 63 or not pattern.match(value):
            raise ValueError(f"must be a {what}, {ends}, got {value!r}")
        return value

    return AfterValidator(check)


DnsLabel = Annotated[
    str,
    _kubernetes_name(_DNS_LABEL, "DNS-1123 label: at most 63 lowercase letters, digits or '-'"),
]
# A job's or service's name: it also names a Service (headless for rendezvous, or the serving
# one) and the controllers' Services, which must be DNS-1035 labels (a leading digit is refused).
ObjectName = Annotated[
    str,
    _kubernetes_name(
        _DNS_1035,
        "DNS-1035 label (it names Services): at most 63 lowercase letters, digits or '-'",
        "starting with a letter and ending with a letter or digit",
    ),
]
LabelValue = Annotated[
    str,
    _kubernetes_name(
        _LABEL_VALUE, "Kubernetes label value: at most 63 letters, digits, '-', '_' or '.'"
    ),
]


# A Secret's or ConfigMap's name (spec.env references): a DNS subdomain of at most 253 characters.
def _object_name(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"must be a Secret/ConfigMap name (a DNS subdomain), got {value!r}")
    return value


ObjectRefName = Annotated[str, AfterValidator(_object_name)]


class Metadata(SpecModel):
    """Identity of a job."""

    name: ObjectName = Field(
        description="Job name; names the run directory and cluster objects (at most 63 "
        "characters, less on targets whose controllers add to it: `gpufleet validate --target`)."
    )
    namespace: DnsLabel | None = Field(
        default=None, description="Cluster only: the tenant namespace to submit to."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra labels on every object rendered. Keys gpufleet or a controller sets are "
            "refused: gpufleet.dev, kubernetes.io, k8s.io, x-k8s.io, kubeflow.org and "
            "volcano.sh domains (app.kubernetes.io/version and other keys gpufleet does not "
            "set are free); they select pods and attribute GPUs."
        ),
    )

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, value: dict[str, str]) -> dict[str, str]:
        problems = [p for key, v in value.items() if (p := label_problem(key, v))]
        if problems:
            raise ValueError("; ".join(problems))
        return value


# Label keys whose owners are gpufleet or the controllers it renders for: a user label with one
# would override gpufleet's own (the rendezvous Service would select no pod, GPU usage would be
# attributed to another job) or confuse a controller.
_RESERVED_DOMAINS = (
    "gpufleet.dev",
    "kubernetes.io",
    "k8s.io",
    "x-k8s.io",
    "kubeflow.org",
    "volcano.sh",
)
# app.kubernetes.io's recommended labels are the user's, except those gpufleet sets itself.
_OWN_APP_LABELS = frozenset({"name", "instance", "component", "part-of", "managed-by"})


def label_key_problem(key: str) -> str | None:
    """What is wrong with ``key`` as a label key (Kubernetes' syntax), or None."""
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_VALUE.match(name) or len(name) > 63:
        return (f"label key {key!r}: the name part must be at most 63 letters, digits, '-', "
                "'_' or '.', starting and ending with a letter or digit")  # fmt: skip
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"label key {key!r}: the prefix must be a DNS subdomain such as example.com"
    return None


def _label_key(value: str) -> str:
    problem = label_key_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# A node label key (a topology level): any domain, kubernetes.io's included.
LabelKey = Annotated[str, AfterValidator(_label_key)]


def label_problem(key: str, value: str) -> str | None:
    """What is wrong with the label ``key: value`` (Kubernetes' syntax, gpufleet's reserved
    keys), or None."""
    prefix, _, name = key.rpartition("/")
    problem = label_key_problem(key)
    if problem:
        return problem
    domain = next((d for d in _RESERVED_DOMAINS if prefix == d or prefix.endswith("." + d)), None)
    if domain and not (prefix == "app.kubernetes.io" and name not in _OWN_APP_LABELS):
        return (f"label key {key!r} is reserved ({domain} keys are set by gpufleet or a "
                "controller, and select its pods): use a key of your own domain")  # fmt: skip
    if value and (len(value) > 63 or not _LABEL_VALUE.match(value)):
        rule = "empty or at most 63 letters, digits, '-', '_' or '.', starting and ending"
        return f"label {key!r}: the value must be {rule} with a letter or digit, got {value!r}"
    return None
