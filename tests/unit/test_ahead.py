"""A fixture's value begun in the background (tests/support/ahead.py): taken once made, left at
the fixture's tear-down; made in place when nothing began it; its error raised in the test
that takes it; left at the end when never taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support import ahead


class Made:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.threads: list[str] = []
        self.release = threading.Event()

    @contextmanager
    def enter(self) -> Iterator[str]:
        self.threads.append(threading.current_thread().name)
        self.release.wait(10)
        self.events.append("entered")
        yield "value"
        self.events.append("left")


def test_a_begun_value_is_waited_for_taken_and_left_at_tear_down() -> None:
    made = Made()
    ahead.begin("x", made.enter)
    fixture = ahead.take("x", made.enter)
    threading.Timer(0.2, made.release.set).start()
    assert next(fixture) == "value"  # waited for the thread
    assert made.threads == ["ahead-x"] and made.events == ["entered"]
    with pytest.raises(StopIteration):
        next(fixture)
    assert made.events == ["entered", "left"]


def test_nothing_begun_is_made_in_place() -> None:
    made = Made()
    made.release.set()
    fixture = ahead.take("y", made.enter)
    assert next(fixture) == "value" and made.threads == [threading.current_thread().name]
    with pytest.raises(StopIteration):
        next(fixture)
    assert made.events == ["entered", "left"]


def test_an_error_while_begun_is_raised_where_it_is_taken() -> None:
    @contextmanager
    def failing() -> Iterator[str]:
        raise RuntimeError("cluster up failed")
        yield "never"

    ahead.begin("z", failing)
    with pytest.raises(RuntimeError, match="cluster up failed"):
        next(ahead.take("z", failing))


def test_what_was_never_taken_is_left_at_the_end() -> None:
    made = Made()
    made.release.set()
    ahead.begin("w", made.enter)
    ahead.drop_all()
    assert made.events == ["entered", "left"]
    assert next(ahead.take("w", made.enter)) == "value"  # begun no more: made in place
