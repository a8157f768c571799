"""Which worker commands run as the shim's function in a forked worker (gpufleet.launch.forked)."""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.launch import forked, shim


def test_the_shims_command_becomes_its_function_in_a_forkserver() -> None:
    argv = [sys.executable, "-u", "-m", "gpufleet.launch.shim", "-m", "pkg.train", "--lr", "1"]
    entry, args, method = forked.entrypoint(argv)
    assert entry is shim.worker and args == ["-m", "pkg.train", "--lr", "1"]
    assert method == "forkserver"
    # the forkserver imports torch and the checkpoint module once, for every worker it forks,
    # and what __main__ (here pytest's) imports: a forked worker runs __main__ again
    preload = multiprocessing.forkserver._forkserver._preload_modules
    assert preload == [*forked.PRELOAD, *forked.main_imports()]
    assert forked.main_imports()  # pytest's __main__, or an xdist worker's execnet
    assert forked.entrypoint(["python", "-m", "gpufleet.launch.shim", "t.py"])[1] == ["t.py"]


def test_any_other_command_is_started_as_given() -> None:
    for argv in (["python", "-u", "train.py"], ["python", "-m", "gpufleet.launch.shim"],
                 ["/bin/echo", "-m", "gpufleet.launch.shim", "x"]):  # fmt: skip
        assert forked.entrypoint(argv) == (argv[0], argv[1:], None)


# An agent: torch imported, a SIGTERM handler of its own and stdout redirected (as the CLI's
# progress bar does), OMP_NUM_THREADS set after torch loaded (as the launchers set it). Its
# forkserver must be its own fork (its command line, not a new Python's), and a worker must
# see what a new interpreter's would: one thread (once it asked, as the shim does), default
# SIGTERM, the real stdout; and the objects of torch frozen, which its collector never walks
# (the stdlib's server freezes nothing).
AGENT = """
import gc, io, json, multiprocessing, os, signal, sys, threading
import torch
from gpufleet.launch import forked, zygote
def probe(q):
    import torch
    zygote.threads_from_environment()  # as gpufleet.launch.shim.worker does first
    q.put({"server": open(f"/proc/{os.getppid()}/cmdline").read(), "threads":
           torch.get_num_threads(), "sigterm": signal.getsignal(signal.SIGTERM) is
           signal.SIG_DFL, "stdout": sys.stdout is sys.__stdout__,
           "frozen": gc.get_freeze_count()})
if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: None)
    sys.stdout = io.StringIO()
    os.environ["OMP_NUM_THREADS"] = "1"
    multiprocessing.set_forkserver_preload(["torch"])
    forked.start(sys.argv[1])
    forked_here = multiprocessing.forkserver._forkserver._forkserver_pid
    ctx = multiprocessing.get_context("forkserver")
    q = ctx.Queue()
    p = ctx.Process(target=probe, args=(q,))
    p.start(); seen = q.get(timeout=60); p.join()
    forked.stop("forkserver")
    gone = not os.path.exists(f"/proc/{forked_here}")
    print(json.dumps({**seen, "agent": open("/proc/self/cmdline").read(), "gone": gone}),
          file=sys.__stdout__)
"""


@pytest.mark.parametrize("method", ["forkserver", None])
def test_the_forkserver_is_the_agents_fork_and_its_workers_see_a_new_interpreters_state(
    method: str | None,
    tmp_path: Path,
) -> None:
    """A forkserver started anew imports torch again (3.2 CPU-s of a local run's 11): it is
    the agent's fork, once ``start`` is given the forkserver method; else the stdlib's own."""
    (tmp_path / "agent.py").write_text(AGENT)  # a worker runs __main__ by path again
    argv = [sys.executable, str(tmp_path / "agent.py"), method or ""]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert (seen["server"] == seen["agent"]) is (method == "forkserver")
    assert "multiprocessing.forkserver" in seen["server"] or method
    assert seen["threads"] == 1 and seen["sigterm"] and seen["stdout"] and seen["gone"]
    assert (seen["frozen"] > 100_000) is (method == "forkserver"), seen["frozen"]
