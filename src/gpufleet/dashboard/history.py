"""History: a finished job's page after its objects are gone, from what gpufleet keeps beside
its checkpoints (``gpufleet dashboard --history LOCATION``): the checkpoints with their
integrity, and the ranks' logs each pod's launcher kept at exit (gpufleet.launch.keptlogs),
whose rank 0 lines give the curves and whose directories say which pods ran and how often.

A location is a job's checkpoint directory (it holds ``step_*`` or ``logs``) or a directory of
them, on this machine or an object store (fsspec, with the environment's credentials: the
dashboard's reader, not the jobs')."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from gpufleet.dashboard.curves import ATTEMPT, Curves, attempt_number
from gpufleet.launch.keptlogs import KEPT_DIR
from gpufleet.runtime import integrity


@dataclass
class KeptPod:
    """One pod's launcher, as its kept logs say: when it started and how many tries it ran."""

    name: str  # ``<start>-<pod>``, in time order
    attempts: int


@dataclass
class HistoryEntry:
    """One job's checkpoint directory."""

    location: str
    job: str  # its checkpoints' identity, else the directory's name
    steps: list[int] = field(default_factory=list)
    pods: list[KeptPod] = field(default_factory=list)


@dataclass
class HistoryPage:
    """A job's history page: its entry, checkpoints verified, curves from the kept logs."""

    entry: HistoryEntry
    checkpoints: list[integrity.Entry]
    curves: Curves


def _fs(location: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(location.removeprefix("file://"))  # type: ignore[no-any-return]


def _names(fs: Any, path: str) -> list[str]:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    return []


def _is_job(names: list[str]) -> bool:
    return KEPT_DIR in names or any(integrity.STEP_DIR.match(n) for n in names)


# What reading a location can raise: the storage's refusals and errors (OSError), a scheme
# whose filesystem is not installed (ImportError, ValueError).
UNREADABLE = (OSError, ImportError, ValueError)


def job_dirs(location: str) -> list[str]:
    """The job checkpoint directories at ``location``: itself, or those right under it."""
    fs, root = _fs(location)
    names = _names(fs, root)
    if _is_job(names):
        return [location]
    return [f"{location.rstrip('/')}/{n}" for n in names if _is_job(_names(fs, f"{root}/{n}"))]


def entries(locations: list[str]) -> tuple[list[HistoryEntry], list[str]]:
    """Every job's checkpoint directory under ``locations``, in their order, then by name, and
    one line for each location that could not be read."""
    found, problems = [], []
    for location in locations:
        try:
            found += [entry(d) for d in job_dirs(location)]
        except UNREADABLE as exc:
            problems.append(f"{location}: {type(exc).__name__}: {exc}")
    return found, problems


def entry(location: str) -> HistoryEntry:
    """One job's directory: its checkpoints' steps, whose job they are, the pods that kept logs."""
    fs, root = _fs(location)
    names = _names(fs, root)
    steps = sorted(int(m.group(1)) for n in names if (m := integrity.STEP_DIR.match(n)))
    newest = max((n for n in names if integrity.STEP_DIR.match(n)), default=None)
    job = integrity.owner(fs, f"{root}/{newest}") if newest else None
    pods = [KeptPod(p, len(_attempts(fs, f"{root}/{KEPT_DIR}/{p}")))
            for p in _names(fs, f"{root}/{KEPT_DIR}")]  # fmt: skip
    return HistoryEntry(location, job or location.rstrip("/").rsplit("/", 1)[-1], steps, pods)


def _attempts(fs: Any, pod_dir: str) -> list[str]:
    """``<run id>/attempt_<n>`` under one pod's kept logs, in order."""
    return [f"{run}/{a}" for run in _names(fs, pod_dir)
            for a in sorted(_names(fs, f"{pod_dir}/{run}"), key=attempt_number)
            if a.startswith(ATTEMPT)]  # fmt: skip


def history_page(location: str) -> HistoryPage:
    """The job's checkpoints, each verified, and its curves from every kept try, in order
    (each pod's local rank 0: the job's rank 0 is one of them, and only it logs steps)."""
    fs, root = _fs(location)
    found = entry(location)
    curves = Curves()
    for pod in found.pods:
        pod_dir = f"{root}/{KEPT_DIR}/{pod.name}"
        for attempt in _attempts(fs, pod_dir):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
                text = fs.cat_file(f"{pod_dir}/{attempt}/0/stdout.log")
                curves.add(text.decode(errors="replace").splitlines())
    return HistoryPage(found, integrity.survey(fs, root), curves)
