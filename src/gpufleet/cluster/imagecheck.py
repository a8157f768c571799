"""A worker image that cannot run gpufleet's pods, said in one line: what the image lacks, and
the fix that docs/images.md gives, from what its container reported (the runtime's refusal to
start it, or the last lines of its log, which the pods keep as their termination message:
render/podspec.py). Pure functions over pods as the API server returns them."""

from __future__ import annotations

import re

from gpufleet.kube import Obj

DOC = 'docs/images.md, "Your own PyTorch image"'
_ADD_GPUFLEET = f"add it to the image as {DOC} shows (pip install gpufleet)"
# What a container prints or the runtime says when the image lacks something, and what it lacks.
# Python 3.11: "<python>: Error while finding module specification for 'gpufleet.launch.pod'
# (ModuleNotFoundError: No module named 'gpufleet')"; runc: 'exec: "python": executable file
# not found in $PATH'.
_LACKS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"No module named 'gpufleet'"), "has no gpufleet", _ADD_GPUFLEET),
    (re.compile(r"exec: \\?\"?python\\?\"?: executable file not found"),
     "has no `python` on its PATH", f"gpufleet's pods run `python -m ...`: see {DOC}"),
    (re.compile(r"No module named 'torch'"), "has no torch",
     f"gpufleet runs on the image's torch, 2.8 or later: see {DOC}"),
)  # fmt: skip


def lacks(text: str, image: str) -> str | None:
    """``image IMAGE has no gpufleet (No module named 'gpufleet'): add it ...`` when ``text``
    (a log or the runtime's message) says what the image lacks; else None."""
    for pattern, what, fix in _LACKS:
        found = pattern.search(text)
        if found:
            return f"image {image} {what} ({found.group(0)}): {fix}"
    return None


def image_problems(pods: list[Obj]) -> dict[str, list[str]]:
    """Each distinct problem of the pods' images, with the pods that showed it, in order."""
    found: dict[str, list[str]] = {}
    for pod in pods:
        images = {c["name"]: c.get("image", "?") for c in pod.get("spec", {}).get("containers", [])}
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                for detail in state.values():
                    line = lacks(str((detail or {}).get("message", "")),
                                 images.get(cs.get("name", ""), cs.get("image", "?")))  # fmt: skip
                    name = pod["metadata"]["name"]
                    if line is not None and name not in found.setdefault(line, []):
                        found[line].append(name)
    return found
