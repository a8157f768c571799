"""The skips by marker skip what is marked and nothing else: a folder named like a marker
(tests/cluster/) once made every control-plane test skip as if it needed a live cluster."""

from __future__ import annotations

import pytest

# Each marker whose absence conftest turns into a skip, and the words of that skip's reason.
SKIPS = {
    "cluster": "live Kubernetes cluster",
    "gpu": "needs an NVIDIA GPU",
    "realnodes": "real nodes change the host",
}


# ids that are not the markers' names: an id is a keyword too, and the bug this catches read
# keywords (a test named "cluster" would have been skipped by it, hiding it).
@pytest.mark.parametrize("marker", sorted(SKIPS), ids=lambda m: f"skipped-for-{m}")
def test_only_marked_tests_are_skipped_for_want_of_what_the_marker_needs(
    request: pytest.FixtureRequest, marker: str
) -> None:
    """Over the whole collected session (all of tests/ under `make test`)."""
    wrongly = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker(marker) is None
        and any(SKIPS[marker] in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skip"))
    ]
    assert not wrongly, wrongly
