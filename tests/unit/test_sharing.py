"""A costly fixture shared by several modules (tests/support/sharing.py), in a real pytest run:
set up once, torn down right after the last test in a row that uses it, and never handed to a
test after that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
LATE = """
def test_e(shared):
    pass
"""


def inner_run(where: Path, *modules: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.sharing",
         "-p", "no:cacheprovider", f"--rootdir={where}", *modules],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_a_shared_fixture_is_set_up_once_and_torn_down_after_its_last_test(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_1.py").write_text(FIRST)
    (tmp_path / "test_2.py").write_text(SECOND)
    run = inner_run(tmp_path, str(tmp_path / "test_1.py"), str(tmp_path / "test_2.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout


def test_a_test_asking_for_it_after_its_tear_down_is_refused(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_1.py").write_text(FIRST)
    (tmp_path / "test_2.py").write_text(SECOND)
    (tmp_path / "test_3.py").write_text(LATE)
    run = inner_run(tmp_path, *(str(tmp_path / f"test_{i}.py") for i in (1, 2, 3)))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "4 passed, 1 error" in run.stdout
    refusal = ("RuntimeError: shared fixture shared was torn down after its last test in a row: "
               "run the modules that use it together (tests/support/sharing.py)")  # fmt: skip
    assert refusal in run.stdout
