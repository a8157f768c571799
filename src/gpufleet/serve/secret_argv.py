"""Give tritonserver a secret on its command line without showing it in the process list.

``/proc/<pid>/cmdline`` is readable by every local user; ``/proc/<pid>/environ`` only by the
same user. Triton takes its restricted-API key only as an argument, so the argument carries a
random placeholder and the key travels in the environment: ``argv_shim.c``, preloaded into
tritonserver, puts it in place before ``main`` runs (that file says how and why).

The shim is compiled per start into the caller's private directory (a C compiler, ~0.1 s), never
into a shared cache that another user could replace with code of their own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SECRET_ENV = "GPUFLEET_ARGV_SECRET"
PLACEHOLDER_ENV = "GPUFLEET_ARGV_PLACEHOLDER"
PRELOAD_BEFORE_ENV = "GPUFLEET_ARGV_LD_PRELOAD"


@dataclass(frozen=True)
class Shim:
    """A built shim and the placeholder that stands for the secret in argv."""

    library: Path
    placeholder: str


def build_shim(directory: Path) -> Shim | str:
    """Compile the shim into ``directory`` (private to this user); or say why not, in one line."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler (cc or gcc) on PATH"
    source = resources.files("gpufleet.serve").joinpath("argv_shim.c")
    library = directory / "gpufleet-argv-shim.so"
    try:
        with resources.as_file(source) as path:
            done = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
    except OSError as exc:
        return f"{compiler}: {exc.strerror or exc}"
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        return f"{compiler} failed: {first}"
    # Random, so that a tritonserver started without the shim could not be unlocked by a
    # guessable key.
    return Shim(library, "gpufleet-placeholder-" + secrets.token_hex(16))


@contextmanager
def secret_environment(shim: Shim, secret: str) -> Iterator[None]:
    """While the block runs, a child started with this process's environment gets the shim
    preloaded and ``secret`` in place of the placeholder in its argv. Every variable is put back
    afterwards, so later children inherit none of it."""
    keys = (SECRET_ENV, PLACEHOLDER_ENV, PRELOAD_BEFORE_ENV, "LD_PRELOAD")
    saved = {key: os.environ.get(key) for key in keys}
    before = saved["LD_PRELOAD"] or ""
    os.environ[SECRET_ENV] = secret
    os.environ[PLACEHOLDER_ENV] = shim.placeholder
    os.environ[PRELOAD_BEFORE_ENV] = before
    os.environ["LD_PRELOAD"] = f"{shim.library}:{before}" if before else str(shim.library)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
