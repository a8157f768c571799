"""A costly fixture shared by several test modules: set up once, by the first test that asks,
and torn down right after the last test in a row that uses it.

pytest tears a package or session fixture down at the end of its package or session, and a
module fixture after each module: a chart installed for three modules would be installed three
times, or stay installed beside every later module. Here the fixture (package or session
scope) enters its context manager through ``held``, and this plugin's tear-down hook
(tests/conftest.py loads it) calls ``release_unused`` after each test: a fixture the next test
does not use is torn down at once. The modules that share one must therefore run one after the
other, in one process: in tests/cluster/ (one work unit) by their names' order, elsewhere
joined into one work unit (tests/support/units.py, JOINED).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

_open: dict[str, ExitStack] = {}  # fixture name -> what tears it down
_released: set[str] = set()  # torn down before pytest's own tear-down: never to be used again


def held(name: str, context: AbstractContextManager[T]) -> Iterator[T]:
    """The body of the shared fixture ``name``: enter ``context``, yield its value, and leave
    it at the fixture's tear-down unless ``release_unused`` left it before."""
    stack = ExitStack()
    value = stack.enter_context(context)
    _open[name] = stack
    try:
        yield value
    finally:
        release(name)


def release(name: str) -> None:
    """Tear the shared fixture ``name`` down now, if it is up."""
    stack = _open.pop(name, None)
    if stack is not None:
        stack.close()


def release_unused(nextitem: Any) -> None:
    """After a test: tear down every shared fixture that ``nextitem`` (None: the last test
    of this process) does not use."""
    wanted = set(getattr(nextitem, "fixturenames", ()))
    for name in [n for n in _open if n not in wanted]:
        release(name)
        _released.add(name)


def check_not_released(item: Any) -> None:
    """Before a test: refuse one that asks for a shared fixture already torn down (pytest
    would hand it the torn-down value): its modules did not run one after the other."""
    stale = sorted(_released.intersection(getattr(item, "fixturenames", ())))
    if stale:
        raise RuntimeError(f"shared fixture {', '.join(stale)} was torn down after its last "
                           "test in a row: run the modules that use it together "
                           "(tests/support/sharing.py)")  # fmt: skip


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_not_released(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After pytest's own tear-down of ``item``: the shared fixtures ``nextitem`` does not use."""
    release_unused(nextitem)
