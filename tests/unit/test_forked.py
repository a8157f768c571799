"""Which worker commands run as the shim's function in a forked worker (gpufleet.launch.forked)."""

from __future__ import annotations

import multiprocessing.forkserver
import sys

from gpufleet.launch import forked, shim


def test_the_shims_command_becomes_its_function_in_a_forkserver() -> None:
    argv = [sys.executable, "-u", "-m", "gpufleet.launch.shim", "-m", "pkg.train", "--lr", "1"]
    entry, args, method = forked.entrypoint(argv)
    assert entry is shim.worker and args == ["-m", "pkg.train", "--lr", "1"]
    assert method == "forkserver"
    # the forkserver imports torch and the checkpoint module once, for every worker it forks
    assert multiprocessing.forkserver._forkserver._preload_modules == list(forked.PRELOAD)
    assert forked.entrypoint(["python", "-m", "gpufleet.launch.shim", "t.py"])[1] == ["t.py"]


def test_any_other_command_is_started_as_given() -> None:
    for argv in (["python", "-u", "train.py"], ["python", "-m", "gpufleet.launch.shim"],
                 ["/bin/echo", "-m", "gpufleet.launch.shim", "x"]):  # fmt: skip
        assert forked.entrypoint(argv) == (argv[0], argv[1:], None)
