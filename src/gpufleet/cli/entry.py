"""The ``gpufleet`` command's entry point (pyproject.toml's [project.scripts]). The command line
is the ``cli`` extra (typer, rich): a worker's install does without it, so where it is missing
the command says so in one line and exits 2, instead of an ImportError's traceback."""

from __future__ import annotations

import sys

from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.extras import install_hint

CLI_MODULES = ("typer", "rich")


def main() -> None:
    for name in CLI_MODULES:
        try:
            __import__(name)
        except ImportError:
            print(f"gpufleet: {name}: the command line needs: {install_hint('cli')}",
                  file=sys.stderr)  # fmt: skip
            sys.exit(EXIT_BAD_INPUT)
    from gpufleet.cli.main import main as run

    run()
