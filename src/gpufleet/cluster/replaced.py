"""Pods their controller has replaced, kept apart from the job's current pods in ``status``.

A Job whose pod failure policy ignores a pod's exit (75: preempted, or its rendezvous host was
lost) makes a new pod for that index and leaves the old one Failed; so do JobSet's child Jobs.
Counted with the current pods, a job that runs all its pods again read "Starting, pods 2/3
Running" and showed no progress (seen on real nodes after a network partition). A Failed pod
is replaced when another pod of the same ``generateName`` (the Job controller's
``<job>-<index>-``) is newer or has not failed; pods named without it (Kubeflow's, Volcano's,
which reuse the name) are never told apart this way, and need not be."""

from __future__ import annotations

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.kube import Obj

SHOWN = 3  # replaced pods named in the status line, the newest first


def _failed(pod: Obj) -> bool:
    return bool((pod.get("status") or {}).get("phase") == "Failed")


def split_replaced(pods: list[Obj]) -> tuple[list[Obj], list[Obj]]:
    """``(current, replaced)``, each in the order given."""
    by_prefix: dict[str, list[Obj]] = {}
    for pod in pods:
        prefix = pod["metadata"].get("generateName")
        if prefix:
            by_prefix.setdefault(prefix, []).append(pod)

    def replaced(pod: Obj) -> bool:
        created = pod["metadata"].get("creationTimestamp") or ""
        others = by_prefix.get(pod["metadata"].get("generateName") or "", [])
        return _failed(pod) and any(
            other is not pod
            and (not _failed(other) or (other["metadata"].get("creationTimestamp") or "") > created)
            for other in others
        )

    current: list[Obj] = []
    gone: list[Obj] = []
    for pod in pods:
        (gone if replaced(pod) else current).append(pod)
    return current, gone


def replaced_note(replaced: list[Obj]) -> str | None:
    """``replaced: pod a (exit 75: preempted or lost its rendezvous host, not counted)``."""
    from gpufleet.cluster.status import PodState

    if not replaced:
        return None
    newest = sorted(replaced, key=lambda p: p["metadata"].get("creationTimestamp") or "")[::-1]
    said = []
    for pod in newest[:SHOWN]:
        state = PodState.of(pod)
        why = f"exit {state.last_exit}" if state.last_exit is not None else state.phase
        if state.last_exit == EXIT_PREEMPTED:
            why += ": preempted or lost its rendezvous host, not counted"
        said.append(f"pod {state.name} ({why})")
    more = f" and {len(replaced) - SHOWN} more" if len(replaced) > SHOWN else ""
    return "replaced: " + ", ".join(said) + more
