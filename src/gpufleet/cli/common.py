"""What every command shares: loading specs, reporting errors, exit codes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.text import Text

from gpufleet.console import err_console
from gpufleet.errors import EXIT_FAILED, GpufleetError, UserInputError
from gpufleet.spec import Spec, TrainingJob, load_spec, load_training_job

RunRootOption = Annotated[
    Path, typer.Option(help="Where the local runs' directories (logs, checkpoints) live.")
]
# A server's TLS options (`gpufleet exporter`, `gpufleet serve`): HTTPS only with a certificate,
# mutual TLS with a client CA (observe/tls.py checks them together).
TlsCertOption = Annotated[
    str | None,
    typer.Option(
        help="Serve HTTPS, and gRPC over TLS where it serves gRPC, with this PEM "
        "certificate (a TLS Secret's tls.crt)."
    ),
]
TlsKeyOption = Annotated[
    str | None, typer.Option(help="The certificate's PEM key (tls.key); with --tls-cert.")
]
TlsClientCaOption = Annotated[
    str | None,
    typer.Option(help="Mutual TLS: serve only clients with a certificate this CA signed."),
]


class Output(StrEnum):
    """How a command prints its result."""

    text = "text"
    json = "json"


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (Ctrl-C): long-running servers wait on it, then shut
    down cleanly instead of dying mid-request."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def load_any(path: str, overrides: list[str] | None) -> Spec:
    """Load a spec of any kind or exit 2 with every error and its field path; a TrainingJob
    with its checkpoint directory resolved (resolve_checkpoint_dir)."""
    try:
        spec = load_spec(path, overrides)
    except UserInputError as exc:
        fail(exc)
    return resolve_checkpoint_dir(spec, Path(path)) if isinstance(spec, TrainingJob) else spec


def load_job(path: str, overrides: list[str] | None) -> TrainingJob:
    """Load a TrainingJob or exit 2 with every error and its field path; its checkpoint
    directory resolved (resolve_checkpoint_dir)."""
    try:
        job = load_training_job(path, overrides)
    except UserInputError as exc:
        fail(exc)
    return resolve_checkpoint_dir(job, Path(path))


def resolve_checkpoint_dir(job: TrainingJob, spec_file: Path) -> TrainingJob:
    """The checkpoint-directory rule of every command that reads a spec (through load_job and
    load_any): a relative local ``spec.checkpoint.dir`` is relative to the spec file's
    directory (not to wherever the command happens to start), resolved and said once. URIs
    and absolute paths stay as they are."""
    given = job.spec.checkpoint.dir
    if not given or "://" in given or Path(given).is_absolute():
        return job
    resolved = str((spec_file.resolve().parent / given).resolve())
    err_console.print(f"checkpoints: {resolved} (spec.checkpoint.dir {given!r}, relative to "
                      f"{spec_file})", markup=False)  # fmt: skip
    checkpoint = job.spec.checkpoint.model_copy(update={"dir": resolved})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"checkpoint": checkpoint})})


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Cluster and input errors end the command with their exit code and message."""
    try:
        yield
    except GpufleetError as exc:
        fail(exc)


def fail(exc: GpufleetError) -> NoReturn:
    """Print a gpufleet error without a traceback and exit with its code."""
    err_console.print(Text.assemble(("error:", "bold red"), f" {exc}"))
    sys.exit(exc.exit_code)


def internal_error(exc: BaseException) -> NoReturn:
    """Report a bug without a wall of traceback (GPUFLEET_DEBUG=1 shows it)."""
    if os.environ.get("GPUFLEET_DEBUG"):
        raise exc
    err_console.print(
        Text.assemble(
            ("internal error:", "bold red"),
            f" {type(exc).__name__}: {exc}\n",
            "set GPUFLEET_DEBUG=1 for the traceback, and please report it",
        )
    )
    sys.exit(EXIT_FAILED)
