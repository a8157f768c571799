"""Worker entry point: ``python -m gpufleet.launch.shim <script.py | -m module> [args...]``.

Runs the user's script or module exactly as ``python script.py args`` / ``python -m module``
would (runpy, ``__main__``, the same sys.argv and sys.path[0]), after arranging that the worker
dies with its agent. Errors are recorded in torchelastic's error file, so the launcher can name
the failing rank and show its traceback.
"""

from __future__ import annotations

import os
import runpy
import sys

from gpufleet.launch.orphans import ENV_AGENT_PID, die_with_parent


def _run(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module sets argv[0] to the module's file
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def main() -> None:
    """Run the command in ``sys.argv[1:]``."""
    agent = os.environ.get(ENV_AGENT_PID)
    die_with_parent(expected_parent=int(agent) if agent else None)
    if len(sys.argv) < 2:
        print("usage: python -m gpufleet.launch.shim <script.py | -m module> [args...]")
        sys.exit(2)
    # Imported after die_with_parent: importing torch takes seconds, time in which an agent
    # SIGKILLed would leave this process behind.
    from torch.distributed.elastic.multiprocessing.errors import record

    record(_run)(sys.argv[1:])


if __name__ == "__main__":
    main()
