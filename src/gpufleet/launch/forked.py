"""Workers forked from a server that imported torch once, instead of a new Python each.

torchelastic starts a worker given as a command with ``subprocess.Popen``: every worker, and
every worker again at each restart, imports torch anew. PyPI's torch links its CUDA libraries
even where there is no GPU: on 2 cores ``import torch`` costs 3.3 CPU-s and
``torch.distributed.checkpoint`` 1 more (measured), against well under a second for the digits
job's 40 steps. Given a function instead, torchelastic starts the workers with Python's
multiprocessing, here its ``forkserver``: a server process started by the agent on its first
worker, single-threaded, which imports ``PRELOAD`` once and forks each worker from itself on
request, at every restart too, until the agent exits (it ends with the agent: Python's
forkserver leaves its loop when the agent's end of its pipe closes). Not the agent itself
(``fork``): it runs threads (the rendezvous' keep-alive, the c10d store's), and a fork copies
locks other threads held.

``entrypoint`` makes the shim's command (``python -u -m gpufleet.launch.shim ...``, what the
local backend and the pods' launcher run) a call of ``gpufleet.launch.shim.worker`` in such a
worker; any other command is started as given.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import Any

from gpufleet.launch import zygote
from gpufleet.launch.worker import SHIM_MODULE

START_METHOD = "forkserver"
# What every worker imports before the user's code runs: the forkserver imports it once.
# torch._dynamo: torch imports it on the first optimizer's construction (Optimizer.__init__ is
# wrapped in torch._disable_dynamo), about 1 CPU-s in every worker, at every restart, otherwise.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed.checkpoint", SHIM_MODULE,
           "gpufleet.runtime")  # fmt: skip


def entrypoint(
    argv: list[str], *, fork: bool = True
) -> tuple[str | Callable[..., Any], list[str], str | None]:
    """torchelastic's ``(entrypoint, args, start_method)`` for the worker command ``argv``:
    the shim as a function in a forked worker, or ``argv`` as a command (start method None:
    the launcher's own; always so without ``fork``: a worker of another framework must not
    start as a fork of a process that imported torch)."""
    if not fork:
        return argv[0], argv[1:], None
    args = argv[1:]
    if args[:1] == ["-u"]:
        args = args[1:]
    python = os.path.basename(argv[0]).startswith("python")
    if not python or args[:2] != ["-m", SHIM_MODULE] or len(args) < 3:
        return argv[0], argv[1:], None
    from gpufleet.launch.shim import worker

    multiprocessing.set_forkserver_preload([*PRELOAD, *main_imports()])
    logging.getLogger(_FAILURE_LOGGER).addFilter(_no_exit_traceback)
    return worker, args[2:], START_METHOD


def main_imports() -> list[str]:
    """The modules this process's ``__main__`` runs from: a forked worker runs ``__main__``
    again before its function (multiprocessing's ``spawn.prepare``: by name for ``python -m``,
    by path for a console script), and imports what it imports: the CLI's modules, 0.5 CPU-s in
    every worker, unless the forkserver imported them once."""
    main = sys.modules["__main__"]
    name = getattr(main.__spec__, "name", None)
    if name:
        return [name]
    funcs = (v for v in vars(main).values() if inspect.isfunction(v))
    return sorted({f.__module__ for f in funcs if f.__module__ not in ("__main__", None)})


def start(start_method: str | None) -> None:
    """Before a launch that forks its workers, while this process runs no other thread: the
    forkserver, as a fork of this process (gpufleet.launch.zygote), not a new Python."""
    if start_method == START_METHOD:
        zygote.start()


def stop(start_method: str | None) -> None:
    """After a launch that forked its workers: stop the forkserver. Its environment is the
    agent's when it started, and a worker sees that (torchelastic sets only the rank's own
    variables), so a second launch in this process (a benchmark's next job) must start its own
    or its workers write into the first job's run directory. ``_stop`` is the stdlib's (3.11 to
    3.13: closes the server's "alive" pipe and waits for it)."""
    if start_method == START_METHOD:
        from multiprocessing import forkserver

        forkserver._forkserver._stop()  # type: ignore[attr-defined]


# torchelastic logs a function worker's non-zero exit with the traceback of its own
# ProcessExitedException (agent internals, no worker frame), where a command's exit gets one
# line: the line stays, the traceback goes (the worker's own error is in its log and error file).
_FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def _no_exit_traceback(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if type(exc).__name__ == "ProcessExitedException":
        record.exc_info = record.exc_text = None
    return True
