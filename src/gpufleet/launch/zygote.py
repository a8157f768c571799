"""The agent's forkserver started as a fork of the agent, which has imported torch already.

Python's forkserver (gpufleet.launch.forked) is a new interpreter: it imports torch again,
3.2 CPU-s of a local digits run's 11 (4 under coverage), once per agent, so once per local run
and per pod. Forked from the agent instead, before the agent starts any thread, it has torch
already and imports only the rest of the preload list. Then it runs the stdlib's own server
loop (``multiprocessing.forkserver.main``) and the stdlib's client side talks to it as to its
own: ``ForkServer.ensure_running`` finds it alive and starts no other, ``_stop`` ends it.

Only while this process runs no thread but the main one (``start`` checks): a fork copies the
locks other threads held. The agent forks it before torchelastic's rendezvous, its store's
threads, the pod's metrics server and host watch start. Elsewhere (a progress bar's thread)
the stdlib starts its own as before. What the server must not keep of the agent it puts back
as a new interpreter has it: the agent's signal handlers, its wakeup fd, its redirected
``sys.stdout``, the agent's end of the "alive" pipe (kept, the server would never see the
agent go); its workers size their thread pools (``threads_from_environment``, called by the
shim). The attributes set are the stdlib's private ones, as ``ensure_running`` sets them
(3.11 to 3.13).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import sys
import threading
from typing import NoReturn


def start() -> None:
    """Fork the forkserver from this process now, with the preload list set; nothing when one
    is running already or another thread runs here (the stdlib starts its own later)."""
    from multiprocessing import connection, forkserver, resource_tracker

    server = forkserver._forkserver
    if server._forkserver_pid is not None or threading.active_count() != 1:  # type: ignore[attr-defined]
        return
    resource_tracker.ensure_running()  # before the fork: the server's children share it
    preload = list(server._preload_modules)  # type: ignore[attr-defined]
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _serve(listener.fileno(), alive_r, alive_w, preload)
        os.close(alive_r)
    server._forkserver_address = address  # type: ignore[attr-defined]
    server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]
    server._forkserver_pid = pid  # type: ignore[attr-defined]


def _serve(listener_fd: int, alive_r: int, alive_w: int, preload: list[str]) -> NoReturn:
    """The forked server: the stdlib's loop until the agent's end of the pipe closes."""
    from multiprocessing import forkserver

    code = 1
    try:
        os.close(alive_w)
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        signal.set_wakeup_fd(-1)
        for sig in signal.valid_signals():
            if callable(signal.getsignal(sig)) and sig != signal.SIGINT:
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        preloaded(preload)
        forkserver.main(listener_fd, alive_r, preload)
    except SystemExit:  # the stdlib's way out of its loop: the agent is gone
        code = 0
    finally:
        os._exit(code)


def preloaded(preload: list[str]) -> None:
    """Import the preload list as the stdlib's server would (what fails to import is left
    out), then freeze what the server holds: a worker's garbage collector never walks the
    ~320,000 objects of torch and the preload again. Each full collection in a worker costs
    0.3 CPU-s otherwise, twice a full one: its walk writes every object's header, so the
    fork's shared pages are copied (gc.freeze's own use, per its documentation)."""
    for name in preload:
        with contextlib.suppress(ImportError):
            __import__(name)
    gc.freeze()


def threads_from_environment() -> None:
    """In a worker the server forked: torch's thread pools as a new interpreter sizes them.
    OpenMP reads OMP_NUM_THREADS when its library loads, which in the agent was before the
    launcher set it; a worker's floating-point sums, so its weights, depend on how many
    threads add. Here, not in the server: torch's thread pool made before a fork is remade in
    the child by whichever of its threads asks first, and two at once (autograd's) find none
    (seen: "Invalid thread pool!" after a restart)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
