"""An elastic Job's node range and the resizes recorded on it (``gpufleet.cluster.elastic``
makes them), as ``gpufleet status``, ``gpufleet jobs`` and the dashboard show them."""

from __future__ import annotations

import json
import re

from gpufleet.kube import ANNOTATION_NODE_RANGE, ANNOTATION_RESIZES, Obj

KEPT_RESIZES = 20  # the newest resizes a Job's annotation keeps


def node_range(text: str) -> tuple[int, int] | None:
    """``MIN:MAX`` as two whole numbers, 1 <= MIN <= MAX; None for anything else."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not match:
        return None
    low, high = int(match.group(1)), int(match.group(2))
    return (low, high) if 1 <= low <= high else None


def resizes(job: Obj) -> list[Obj]:
    """The resizes recorded on a Job (oldest first); [] where none or unreadable."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESIZES)
    try:
        kept = json.loads(text) if text else []
    except ValueError:
        return []
    return [r for r in kept if isinstance(r, dict)] if isinstance(kept, list) else []


def describe(entry: Obj) -> str:
    """One recorded resize as a person reads it: ``grew 1→2 at 03:12:05Z (quota freed in
    cohort lab)``."""
    old, new = entry.get("from"), entry.get("to")
    verb = "grew" if isinstance(old, int) and isinstance(new, int) and new > old else "shrank"
    when = str(entry.get("at") or "").split("T")[-1]
    return f"{verb} {old}→{new} at {when} ({entry.get('cause') or 'no cause given'})"


def size_text(job: Obj) -> str | None:
    """``2 of 1–2 nodes`` for an elastic Job (its parallelism within its range); else None."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    span = node_range(annotations.get(ANNOTATION_NODE_RANGE, ""))
    if span is None:
        return None
    size = (job.get("spec") or {}).get("parallelism")
    return f"{size} of {span[0]}–{span[1]} nodes"


def resize_lines(job: Obj) -> list[str]:
    """Each recorded resize of ``job``, oldest first, as ``describe`` writes it."""
    return [describe(entry) for entry in resizes(job)]
