"""Every golden file equals what the renderers produce now, byte for byte. Updating the files is
a separate step (`make goldens`), so this test can never pass by writing what it compares."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.goldens import GOLDENS, golden_text
from tests.support.paths import REPO


@pytest.mark.parametrize("path", list(GOLDENS), ids=lambda p: p.name)
def test_golden(path: Path) -> None:
    assert path.is_file(), f"{path.relative_to(REPO)} is missing; create it with `make goldens`"
    assert golden_text(path) == path.read_text(), (
        f"{path.relative_to(REPO)} differs from the rendering; if the change is intended, run "
        "`make goldens` and review the diff"
    )


def test_goldens_cover_every_file() -> None:
    """No golden file is left unchecked (a renamed target would leave a stale file behind)."""
    on_disk = {p for p in (REPO / "tests" / "golden").glob("*.yaml") if ".spec." not in p.name}
    assert on_disk == set(GOLDENS)
