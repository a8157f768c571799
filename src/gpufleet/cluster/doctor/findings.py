"""One line of ``gpufleet doctor``: a check, its status (OK, WARN, FAIL), what it found and,
unless OK, the fix."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """A check's outcome."""

    OK = "OK"
    WARN = "WARN"  # works, with a limit worth knowing
    FAIL = "FAIL"  # a job would not run (or not as the spec says); doctor exits 1


@dataclass(frozen=True)
class Finding:
    """One check's line: what it checked, its status, what it found, the fix unless OK."""

    check: str
    status: Status
    detail: str
    fix: str = ""


def ok(check: str, detail: str) -> Finding:
    return Finding(check, Status.OK, detail)


def warn(check: str, detail: str, fix: str = "") -> Finding:
    return Finding(check, Status.WARN, detail, fix)


def fail(check: str, detail: str, fix: str = "") -> Finding:
    return Finding(check, Status.FAIL, detail, fix)


def unreadable(check: str, why: str) -> Finding:
    """A check whose objects the API server would not show (``why``: its one line)."""
    return fail(check, why, "run doctor with credentials that may list them (cluster admin)")
