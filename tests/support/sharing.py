"""A costly fixture shared by several test modules: set up once, by the first test that asks,
and torn down right after the last test that uses it.

pytest tears a package or session fixture down at the end of its package or session, and a
module fixture after each module: a chart installed for three modules would be installed three
times, or stay installed beside every later module. Here the fixture (package or session
scope) enters its context manager through ``held``; this plugin (tests/conftest.py loads it)
finds, once the tests are collected and ordered, the last test that uses each fixture, and
tears the fixture down right after that test. The modules that share one must therefore run in
one process, in their collected order: in tests/cluster/ they do (one work unit), elsewhere
they are joined into one work unit (tests/support/units.py, JOINED). A test that asks for one
after its tear-down (its modules ran apart) is an error, not handed the torn-down value.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

_open: dict[str, ExitStack] = {}  # fixture name -> what tears it down
_released: set[str] = set()  # torn down before pytest's own tear-down: never to be used again
_last: dict[str, str] = {}  # fixture name -> the node id of the last test that uses it


def held(name: str, context: AbstractContextManager[T]) -> Iterator[T]:
    """The body of the shared fixture ``name``: enter ``context``, yield its value, and leave
    it at the fixture's tear-down unless it was left after its last test before."""
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


def held_now() -> set[str]:
    """The shared fixtures up now."""
    return set(_open)


def last_users(items: list[Any]) -> dict[str, str]:
    """Each fixture name's last test in ``items`` (the order they run in)."""
    last: dict[str, str] = {}
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            last[name] = item.nodeid
    return last


def release_after(item: Any, nextitem: Any) -> None:
    """After ``item``: tear down every shared fixture whose last test it was (every one, when
    ``nextitem`` is None: this process's last test)."""
    for name in [n for n in _open if nextitem is None or _last.get(n) == item.nodeid]:
        release(name)
        _released.add(name)


def check_not_released(item: Any) -> None:
    """Before a test: refuse one that asks for a shared fixture already torn down (pytest
    would hand it the torn-down value): its modules did not run in their collected order."""
    stale = sorted(_released.intersection(getattr(item, "fixturenames", ())))
    if stale:
        raise RuntimeError(f"shared fixture {', '.join(stale)} was torn down after its last "
                           "test: run the modules that use it in one process, in order "
                           "(tests/support/sharing.py)")  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Once the tests are ordered (tests/conftest.py): each fixture's last test."""
    _last.clear()
    _last.update(last_users(items))


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_not_released(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After pytest's own tear-down of ``item``: the shared fixtures it was the last test of."""
    release_after(item, nextitem)
