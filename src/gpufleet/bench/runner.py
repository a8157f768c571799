"""The edge every benchmark command shares: the job to start from (a spec, or this machine),
running a planned job here and reading its result, writing results, printing rendered jobs.
Nothing here is pure; the plans it runs are (``gpufleet.bench.<name>.plan``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from gpufleet.errors import EXIT_FAILED, FieldError, UserInputError
from gpufleet.spec import TrainingJob


def bad(option: str, message: str) -> NoReturn:
    """Raise the CLI's field-error shape, ``option: message`` (exit 2)."""
    raise UserInputError([FieldError(option, message)])


def say(message: str) -> None:
    """A note on stderr (stdout holds only the table or the JSON)."""
    from gpufleet.console import err_console

    err_console.print(message)


def cuda_here() -> bool:
    """Whether this machine's workers get GPUs."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def load_spec(spec: Path | None) -> TrainingJob | None:
    """The TrainingJob at ``spec``, if given (UserInputError with every problem)."""
    from gpufleet.spec import load_training_job

    return load_training_job(str(spec), None) if spec is not None else None


def need_render_spec(render: str | None, spec: Path | None, why: str) -> None:
    """Refuse ``--render`` without ``--spec`` (``why``: what the spec must give)."""
    if render is not None and spec is None:
        bad("--render", f"needs --spec: {why}")


def run_job(job: TrainingJob, result: Callable[[Path], Path], what: str) -> dict[str, Any]:
    """Run a benchmark job here and read its result file (``result(run_dir)``); exit with the
    job's code, saying why, when it wrote none. Workers' live output goes to stderr: stdout
    holds only the table or the JSON."""
    from gpufleet.launch.local import run_local
    from gpufleet.runtime.files import read_json

    with contextlib.redirect_stdout(sys.stderr):
        summary = run_local(job, fresh=True)
    data = read_json(result(Path(summary.run_dir)))
    if not data:
        say(f"{what} failed ({summary.status}): {summary.message or ''}")
        raise SystemExit(summary.exit_code or EXIT_FAILED)
    return dict(data)


def write_result(
    outdir: Path, name: str, result: dict[str, Any], plot: Callable[[Path], None]
) -> None:
    """``<outdir>/<name>.json`` and, with matplotlib, ``<name>.png``."""
    from gpufleet.runtime.files import write_json_atomic

    outdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(outdir / f"{name}.json", result)
    try:
        plot(outdir / f"{name}.png")
    except ImportError:
        say("note: no plot: pip install 'gpufleet[bench]' for matplotlib")


def print_rendered(job: TrainingJob, target: str) -> None:
    """The cluster objects of ``job`` for ``target``, as YAML on stdout."""
    import yaml

    from gpufleet.render import TARGETS, render

    if target not in TARGETS:
        bad("--render", f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}")
    sys.stdout.write(yaml.safe_dump_all(render(job, target), sort_keys=False))


def print_json(data: dict[str, Any]) -> None:
    """One JSON object on stdout (the CLI's strict JSON)."""
    from gpufleet.console import print_json as strict

    strict(data)
