"""A costly fixture shared by several modules (tests/support/sharing.py): in a real pytest run it
is set up once and torn down right after the last test that uses it; a test that asks after
that is refused, never handed the torn-down value."""

from __future__ import annotations

import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import sharing
from tests.support.paths import REPO

CONFTEST = """
from contextlib import contextmanager
import pytest
from tests.support.sharing import held

EVENTS = []

@contextmanager
def costly():
    EVENTS.append("up")
    yield "value"
    EVENTS.append("down")

@pytest.fixture(scope="session")
def shared():
    yield from held("shared", costly())
"""
FIRST = """
from conftest import EVENTS

def test_a(shared):
    assert shared == "value" and EVENTS == ["up"]

def test_gap():
    assert EVENTS == ["up"]  # not its last test yet: it stays up

def test_b(shared):
    assert EVENTS == ["up"]
"""
SECOND = """
from conftest import EVENTS

def test_c(shared):
    assert EVENTS == ["up"]  # the second module shares the first one's set-up

def test_d():
    assert EVENTS == ["up", "down"]  # torn down after the last test that used it
"""


def test_a_shared_fixture_is_set_up_once_and_torn_down_after_its_last_test(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_1.py").write_text(FIRST)
    (tmp_path / "test_2.py").write_text(SECOND)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.sharing",
         "-p", "no:cacheprovider", f"--rootdir={tmp_path}", str(tmp_path / "test_1.py"),
         str(tmp_path / "test_2.py")],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "5 passed" in run.stdout


def test_a_test_asking_for_it_after_its_last_test_is_refused() -> None:
    """Its tests ran out of their collected order (in two work units, say): the test that asks
    after the tear-down fails."""
    first, last = (SimpleNamespace(nodeid=f"t.py::{n}", fixturenames=["x"]) for n in "ab")
    sharing._last.update(sharing.last_users([first, last]))
    value = sharing.held("x", nullcontext("up"))
    assert next(value) == "up"
    sharing.release_after(first, last)  # not its last test: it stays
    assert "x" in sharing._open
    sharing.release_after(last, first)  # its last test, run before the first
    assert "x" not in sharing._open
    try:
        with pytest.raises(RuntimeError, match=r"^shared fixture x was torn down after its last"):
            sharing.check_not_released(first)
    finally:
        sharing._released.discard("x")
        sharing._last.pop("x", None)
