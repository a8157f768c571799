"""The clusters of tests/cluster/: package fixtures, each started by the first test that asks
and stopped after the package's last test (a worker that finishes this package goes on with
other modules; the clusters would run idle beside them); the lab's chart on the local control
plane, installed once for the modules that use it and uninstalled after the last of them
(tests/support/sharing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest


@pytest.fixture(scope="package")
def devcluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Any]:  # fmt: skip
    """The local control plane (`gpufleet cluster up`: 3 nodes x 4 A30, Kueue, JobSet), started
    once for tests/cluster/ and stopped after its last test (tests/support/devcluster.py). Once
    it is up, the design's cluster of test_devcluster_design starts in the background when
    that module is to run (tests/support/ahead.py)."""
    from tests.support import ahead
    from tests.support.devcluster import session_cluster
    from tests.support.devlab import DESIGN, design_installed

    design = "tests/cluster/test_devcluster_design.py::"
    for cluster in session_cluster(tmp_path_factory):
        if any(item.nodeid.startswith(design) for item in request.session.items):
            ahead.begin(DESIGN, partial(design_installed, tmp_path_factory.mktemp("design")))
        try:
            yield cluster
        finally:
            ahead.drop_all()


@pytest.fixture(scope="package")
def realcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real-node cluster (`gpufleet cluster up --real-nodes 2`, lab values), started once
    after the kwok cluster stops, and stopped after tests/cluster/'s last test: `down` must
    leave the host as it found it (tests/support/realnodes.py)."""
    from tests.support.realnodes import session_real_cluster

    yield from session_real_cluster(tmp_path_factory)


@pytest.fixture(scope="package")
def reallab(realcluster: Any) -> Iterator[Any]:
    """The chart with the lab's values on the real-node cluster, and the research tenant's
    shared claim for checkpoints (tests/support/realnodes.py)."""
    from tests.support.realnodes import session_lab

    yield from session_lab(realcluster)


@pytest.fixture(scope="package")
def lab(devcluster: Any) -> Iterator[Any]:
    """The chart with the 3-node A30 lab's values on the local control plane (tenants research
    and product in cohort "lab"), installed by the first test that asks and uninstalled after
    the last one that uses it (tests/support/devlab.py)."""
    from tests.support.devlab import lab_installed
    from tests.support.sharing import held

    yield from held("lab", lab_installed(devcluster))
