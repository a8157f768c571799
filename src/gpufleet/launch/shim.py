"""Worker entry point: ``python -m gpufleet.launch.shim <script.py | -m module> [args...]``.

Runs the user's script or module exactly as ``python script.py args`` / ``python -m module``
would (runpy, ``__main__``, the same sys.argv and sys.path[0]), after arranging that the worker
dies with its agent. Errors are recorded in torchelastic's error file, so the launcher can name
the failing rank and show its traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpufleet.launch.fatal import write_fatal
from gpufleet.launch.orphans import (
    ENV_AGENT_PID,
    die_with_grandparent,
    die_with_parent,
    name_process,
    release_forkserver,
)
from gpufleet.launch.zygote import threads_from_environment
from gpufleet.runtime.context import (
    DEFAULT_FRAMEWORK,
    ENV_OUTPUT_HANG_TIMEOUT,
    ENV_RUN_DIR,
    env_framework,
)

# A forked worker's process name: gpufleet-rank<RANK> (at most 15 bytes are kept).
WORKER_NAME = "gpufleet-rank"


def _run_user(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module sets argv[0] to the module's file
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


# What the collectives' transports say when the process at the other end is gone (gloo raises a
# plain RuntimeError; c10d's own errors are DistError): the consequence of another rank's
# crash, whose own output says why. Anything else keeps its traceback.
_PEER_GONE = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "gloo/transport/tcp",
    "NCCL communicator was aborted",
)


def _peer_lost(exc: BaseException) -> bool:
    if "torch" not in sys.modules:  # a worker of another framework (spec.framework)
        return False
    try:
        from torch.distributed import DistError
    except ImportError:
        return False
    return isinstance(exc, DistError) or any(s in str(exc) for s in _PEER_GONE)


def _run(argv: list[str]) -> None:
    """The command, with a fatal gpufleet error recorded for the launcher and turned into its
    exit code and one line (rank 0's, or the first to record it), not a traceback."""
    from gpufleet.errors import GpufleetError

    try:
        _run_user(argv)
    except RuntimeError as exc:  # a peer's death seen from here: one line, not a traceback
        if not _peer_lost(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"gpufleet: rank {os.environ.get('RANK', '?')} lost a peer in a collective "
              f"({type(exc).__name__}: {first[:300]}); the launcher restarts the group from the "
              "last checkpoint", file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(1)
    except GpufleetError as exc:
        run_dir = os.environ.get(ENV_RUN_DIR)
        if not exc.fatal or not run_dir:
            raise
        rank = os.environ.get("RANK")
        if write_fatal(Path(run_dir), exc.exit_code, str(exc), int(rank) if rank else None):
            print(f"gpufleet: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)


@contextlib.contextmanager
def _safe_group_teardown() -> Iterator[None]:
    """Work around a PyTorch deadlock at the end of plain DDP + gloo scripts.

    After ``destroy_process_group()`` the DDP Reducer can hold the last reference to the gloo
    group. Freeing the model then runs ``~ProcessGroupGloo`` from a pybind11 destructor that
    keeps the GIL while it joins gloo's worker threads, and a worker thread that is still
    destroying the last all-reduce work needs the GIL (the work's ThreadLocalState holds the
    contextvars object autograd stashes in every backward). Both wait forever. It is a race:
    with three jobs at once on 2 cores, about one run in six of ``examples/torchrun_script.py``
    hung here, with stacks ``Reducer::~Reducer -> ~ProcessGroupGloo -> thread::join`` and
    ``runLoop -> ~AsyncAllreduceWork -> gil_scoped_acquire``.

    The shim keeps a reference to every group the script destroys, so the Reducer is never
    the last owner; after the script returns it sleeps briefly (the GIL is free, gloo's threads
    finish) and drops them, and the destructor finds idle threads. The script runs unchanged.
    """
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
    except ImportError:  # torch without distributed support: nothing to protect
        yield
        return
    retained: list[Any] = []
    original: Callable[..., None] = c10d.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        world = getattr(c10d, "_world", None)
        if group is not None:
            retained.append(group)
        elif world is not None:  # private, hence getattr: without it we only lose the fix
            retained.extend(getattr(world, "pg_map", {}))
        original(group)

    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group
    try:
        yield
    finally:
        dist.destroy_process_group = c10d.destroy_process_group = original
        if retained:
            time.sleep(0.05)
            retained.clear()


def main() -> None:
    """Run the command in ``sys.argv[1:]``."""
    agent = os.environ.get(ENV_AGENT_PID)
    die_with_parent(expected_parent=int(agent) if agent else None)
    if len(sys.argv) < 2:
        print("usage: python -m gpufleet.launch.shim <script.py | -m module> [args...]")
        sys.exit(2)
    _shim(sys.argv[1:])


def worker(*argv: str) -> None:
    """The shim as torchelastic's function entry point, in a worker forked from the agent's
    forkserver (gpufleet.launch.forked) rather than started as ``python -u -m
    gpufleet.launch.shim``: what that command gave the worker, it arranges here."""
    os.setsid()  # as the agent's subprocesses: a terminal's Ctrl-C reaches the agent alone
    release_forkserver()
    agent = os.environ.get(ENV_AGENT_PID)
    die_with_grandparent(int(agent) if agent else None)
    # Its command line is the forkserver's; its name (ps, top, /proc/<pid>/comm) says what it is
    name_process(f"{WORKER_NAME}{os.environ.get('RANK', '')}")
    for stream in (sys.stdout, sys.stderr):  # python -u
        stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    if argv[0] == "-m":  # python -m puts the working directory first on the path
        sys.path.insert(0, os.getcwd())
    threads_from_environment()
    _shim(list(argv))


def _shim(argv: list[str]) -> None:
    timeout = float(os.environ.get(ENV_OUTPUT_HANG_TIMEOUT, "0"))
    if timeout > 0:  # a command job with a hangTimeout: its output or heartbeat is progress
        from gpufleet.runtime.watchdog import watch_output

        watch_output(timeout, rank=int(os.environ.get("RANK", "0")))
    if env_framework() != DEFAULT_FRAMEWORK:
        _framework_worker(argv)
        return
    # Imported after die_with_parent: importing torch takes seconds, time in which an agent
    # SIGKILLed would leave this process behind.
    from torch.distributed.elastic.multiprocessing.errors import record

    with _safe_group_teardown():
        _failing_last(record(_run), argv)


def _failing_last(run: Callable[[list[str]], None], argv: list[str]) -> None:
    """Run a PyTorch worker; one that fails prints its traceback first and only then closes its
    process group's connections (without the exit barrier). Its peers, waiting in a collective
    it never joins, see the connections close and leave at once (they would wait for the hang
    watchdog), and the agent, which stops the whole group as soon as one of them exits, finds
    the cause already in this rank's log (closed first, under load the agent's SIGTERM ended
    this rank before its traceback was printed: the log said only that rank 0 lost a peer)."""
    from gpufleet.runtime.distributed import shutdown_distributed

    try:
        run(argv)
    except SystemExit as exc:  # gpufleet's one-line errors; a peer lost (the group is closed)
        if exc.code not in (None, 0):
            shutdown_distributed(wait_for_peers=False)
        raise
    except Exception:  # any error of the user's code: its traceback, then exit 1
        traceback.print_exc()
        sys.stderr.flush()
        shutdown_distributed(wait_for_peers=False)
        sys.exit(1)


def _framework_worker(argv: list[str]) -> None:
    """A worker of another framework (spec.framework): no torch in it. A TensorFlow worker
    gets its TF_CONFIG here (gpufleet.frameworks.tf.cluster), so a user's script reads it as
    under Kubeflow's TFJob; a bad one is one line and exit 2. A Ray job's driver runs as it
    is (Ray sets up its workers)."""
    from gpufleet.frameworks.tf.cluster import ENV_TF_CONFIG, ClusterConfigError, tf_config

    if env_framework() == "horovod":
        _horovod_worker(argv)
        return
    if env_framework() != "tensorflow":
        _run(argv)
        return
    try:
        config = tf_config(os.environ)
    except ClusterConfigError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if config is not None:
        os.environ[ENV_TF_CONFIG] = json.dumps(config)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines: not in logs
    # Its thread pools as torch's: OMP_NUM_THREADS, which both launchers set (TensorFlow
    # otherwise sizes them by the machine's cores, every worker of a node alike).
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads:
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", threads)
        os.environ.setdefault("TF_NUM_INTEROP_THREADS", threads)
    _run(argv)


def _horovod_worker(argv: list[str]) -> None:
    """A Horovod script's worker: Horovod's slot and Gloo variables from torchrun's
    (gpufleet.frameworks.horovod), then the script, as under horovodrun. Under mpirun (an
    MPIJob) Horovod's MPI controller needs none of them."""
    from gpufleet.frameworks.horovod import SlotError, prepare

    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        try:
            prepare(os.environ)
        except SlotError as exc:
            print(f"gpufleet: spec.framework horovod: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        except (OSError, RuntimeError) as exc:  # the agents' store, or rank 0's server, gone
            print(f"gpufleet: spec.framework horovod: no rendezvous: {exc}", file=sys.stderr,
                  flush=True)  # fmt: skip
            sys.exit(1)
    _run(argv)


if __name__ == "__main__":
    main()
