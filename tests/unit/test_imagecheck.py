"""An image that cannot run gpufleet's pods, in one line of `gpufleet status`: what it lacks
and docs/images.md's fix (gpufleet/cluster/imagecheck.py), from what its containers reported."""

from __future__ import annotations

import pytest

from gpufleet.cluster.imagecheck import DOC, image_problems, lacks
from gpufleet.kube import Obj
from tests.unit.test_cluster import summary

IMAGE = "localhost/team/pytorch:2.8"


@pytest.mark.parametrize(("text", "what"), [
    ("/usr/bin/python: Error while finding module specification for 'gpufleet.launch.pod' "
     "(ModuleNotFoundError: No module named 'gpufleet')", "has no gpufleet"),
    ('failed to create containerd task: failed to create shim task: OCI runtime create failed: '
     'runc create failed: unable to start container process: exec: "python": executable file '
     'not found in $PATH: unknown', "has no `python` on its PATH"),
    ("Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'torch'",
     "has no torch"),
])  # fmt: skip
def test_what_an_image_lacks_is_named_with_the_pages_fix(text: str, what: str) -> None:
    line = lacks(text, IMAGE)
    assert line is not None and line.startswith(f"image {IMAGE} {what} (") and DOC in line
    assert "\n" not in line


def test_other_failures_are_not_blamed_on_the_image() -> None:
    for text in (
        "",
        "RuntimeError: CUDA error: out of memory",
        'exec: "pythonx": not found',
        "No module named 'gpufleet_plugins'",
        "No module named 'gpufleet.serve'",
    ):
        assert lacks(text, IMAGE) is None, text


def test_status_says_it_once_for_every_pod_in_place_of_their_exit_codes() -> None:
    """Two pods that failed alike: one line, for the first; not "container last exited 1"."""
    st = summary("no-gpufleet")
    said = [r for r in st.reasons if f"image {IMAGE} has no gpufleet" in r]
    assert said == [
        f"pod digits-0-aaa1: image {IMAGE} has no gpufleet (No module named "
        f"'gpufleet'): add it to the image as {DOC} shows (pip install gpufleet)"
    ]
    assert not [r for r in st.reasons if "last exited" in r or "CrashLoopBackOff" in r], st.reasons


def test_a_container_the_runtime_would_not_start_says_so_from_its_waiting_state() -> None:
    waiting = {
        "reason": "RunContainerError",
        "message": 'exec: "python": executable file not found in $PATH',
    }
    pod: Obj = {
        "metadata": {"name": "p-0"},
        "spec": {"containers": [{"name": "w", "image": IMAGE}]},
        "status": {"containerStatuses": [{"name": "w", "state": {"waiting": waiting}}]},
    }
    (line,) = image_problems([pod])
    assert line.startswith(f"image {IMAGE} has no `python` on its PATH")
