"""Parsers for the small value languages a spec uses: durations and Kubernetes quantities."""

from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|s|m|h)")
# The longest duration a spec may give (a hang timeout, a grace period); it also keeps every
# duration a finite number that Kubernetes' integer seconds fields hold.
MAX_DURATION = 30 * 24 * 3600.0
_DURATION_SCALE = {"us": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# Kubernetes resource.Quantity: a decimal number with an optional binary or decimal suffix.
_QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")


def parse_duration(value: object) -> float:
    """Return seconds for ``30``, ``2.5``, ``"45s"``, ``"5m"``, ``"1h30m"`` or ``"250ms"``.

    Raises ValueError with a user-facing message for anything else or a negative value.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30, '45s', '5m' or '1h30m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            parts = _DURATION_PART.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"expected a duration such as 30, '45s', '5m' or '1h30m', got {value!r}"
                )
            seconds = sum(float(n) * _DURATION_SCALE[u] for n, u in parts)
    else:
        raise ValueError("expected a duration such as 30, '45s', '5m' or '1h30m'")
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"must be a non-negative duration, got {value!r}")
    if seconds > MAX_DURATION:
        raise ValueError(f"must be at most 30 days ({MAX_DURATION:.0f} s), got {value!r}")
    return seconds


def parse_quantity(value: object) -> str:
    """Validate a Kubernetes quantity (``2``, ``500m``, ``4Gi``) and return it as a string."""
    if isinstance(value, bool):
        raise ValueError("expected a Kubernetes quantity such as 2, '500m' or '4Gi'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"must not be negative, got {value}")
        return str(value)
    if isinstance(value, str) and _QUANTITY.match(value.strip()):
        return value.strip()
    raise ValueError(f"expected a Kubernetes quantity such as 2, '500m' or '4Gi', got {value!r}")
