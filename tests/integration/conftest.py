"""Fixtures shared by several modules of tests/integration/, each set up once by the first test
that asks and torn down after the last one that uses it (tests/support/sharing.py;
their modules run as one work unit: tests/support/units.py, JOINED)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The digits model trained, exported and served by real Triton (tests/support/triton.py):
    test_serving.py and test_serving_cli.py."""
    from tests.support.sharing import held
    from tests.support.triton import triton_serving

    yield from held("served", triton_serving(tmp_path_factory.mktemp("serving")))
