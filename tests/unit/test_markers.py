"""The skips by marker skip what is marked and nothing else: a folder named like a marker
(tests/cluster/) once made every control-plane test skip as if it needed a live cluster."""

from __future__ import annotations

import pytest


def _skip_reasons(item: pytest.Item) -> list[str]:
    return [str(m.kwargs.get("reason", "")) for m in item.iter_markers("skip")]


def test_only_tests_marked_cluster_are_skipped_for_want_of_a_live_cluster(
    request: pytest.FixtureRequest,
) -> None:
    """Over the whole collected session (all of tests/ under `make test`)."""
    wrongly = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker("cluster") is None
        and any("live Kubernetes cluster" in r for r in _skip_reasons(item))
    ]
    assert not wrongly, wrongly
    wrongly = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker("gpu") is None
        and any("needs an NVIDIA GPU" in r for r in _skip_reasons(item))
    ]
    assert not wrongly, wrongly
