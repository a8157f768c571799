"""A costly fixture's value made in the background, ahead of the first test that asks for it.

The control plane's work unit (all of tests/cluster/, one worker) mostly waits on controllers,
and its wall time is the suite's longest chain. A cluster that one module starts for itself
(the 50-node design's: `cluster up` and the chart, about 70 s) can start while the modules
before it run: ``begin`` enters its context manager in a thread, and the module's fixture
(``take``) waits for it, or enters it itself when nothing began it. What began and was never
taken is left by ``drop_all``, at the end of the unit that began it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
Enter = Callable[[], AbstractContextManager[Any]]


@dataclass
class _Begun:
    thread: threading.Thread
    stack: ExitStack = field(default_factory=ExitStack)
    value: Any = None
    error: BaseException | None = None


_begun: dict[str, _Begun] = {}


def begin(name: str, enter: Enter) -> None:
    """Enter ``enter()`` in a thread of its own now; ``take(name, ...)`` gets its value."""

    def run() -> None:
        try:
            begun.value = begun.stack.enter_context(enter())
        except BaseException as exc:  # raised again in the test that takes it
            begun.error = exc

    begun = _Begun(threading.Thread(target=run, name=f"ahead-{name}", daemon=True))
    _begun[name] = begun
    begun.thread.start()


def take(name: str, enter: Enter) -> Iterator[Any]:
    """The body of the fixture ``name``: the value begun ahead (waited for), else entered now;
    left at the fixture's tear-down either way."""
    begun = _begun.pop(name, None)
    if begun is None:
        with enter() as value:
            yield value
        return
    begun.thread.join()
    if begun.error is not None:
        raise begun.error
    with begun.stack:
        yield begun.value


def drop_all() -> None:
    """Leave every context begun and never taken (its modules did not run)."""
    while _begun:
        _, begun = _begun.popitem()
        begun.thread.join()
        begun.stack.close()
