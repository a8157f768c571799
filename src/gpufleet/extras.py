"""Optional dependencies (the package's extras): one way to say that one is missing. A command
that needs a package of an extra it lacks exits 2 (EXIT_BAD_INPUT: nothing was started) with
the install command, never an ImportError's traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

from gpufleet.errors import FieldError, UserInputError


def install_hint(extra: str) -> str:
    """The command that installs an extra."""
    return f"pip install 'gpufleet[{extra}]'"


def missing(extra: str, package: str, what: str = "") -> UserInputError:
    """The error for a missing package of ``extra``: ``package: <what> needs: pip install ...``."""
    needs = f"{what} needs" if what else "needs"
    return UserInputError([FieldError(package, f"{needs}: {install_hint(extra)}")])


def require(extra: str, *modules: str, what: str = "") -> list[ModuleType]:
    """Import ``modules`` (all of an extra's that a command needs); a missing one raises
    ``missing(extra, <its name>, what)``."""
    loaded = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as exc:
            raise missing(extra, exc.name or name, what) from exc
    return loaded
