"""``gpufleet doctor``: what the current kubeconfig's cluster lacks for gpufleet."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.common import Output, fail
from gpufleet.cluster import Cluster
from gpufleet.cluster.doctor import TARGET_NEEDS, Finding, Status, diagnose, gather
from gpufleet.console import print_json
from gpufleet.errors import EXIT_FAILED, FieldError, GpufleetError, UserInputError


def doctor(
    target: Annotated[
        list[str] | None,
        typer.Option(
            "--target",
            "-t",
            help="A render target the team uses (repeatable): every controller it needs must "
            "run. Default: the targets whose controllers are installed.",
        ),
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context to use.")] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json")] = Output.text,
) -> None:
    """Check the cluster's prerequisites: one line each, OK / WARN / FAIL with the fix; exit 1
    on any FAIL."""
    targets = target or []
    unknown = [t for t in targets if t not in TARGET_NEEDS]
    if unknown:
        fail(
            UserInputError(
                [
                    FieldError(
                        "--target",
                        (f"unknown target {', '.join(unknown)}; one of: {', '.join(TARGET_NEEDS)}"),
                    )
                ]
            )
        )
    try:
        facts = gather(Cluster.connect(None, context).core.api_client)
    except GpufleetError as exc:
        fail(exc)
    findings = diagnose(facts, targets)
    failed = any(f.status is Status.FAIL for f in findings)
    if output is Output.json:
        print_json({"ok": not failed, "checks": [_as_dict(f) for f in findings]})
    else:
        for f in findings:
            print(_line(f))
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _line(f: Finding) -> str:
    line = f"{f.status.value:<5} {f.check}: {f.detail}"
    return line + (f"\n      fix: {f.fix}" if f.fix else "")


def _as_dict(f: Finding) -> dict[str, str]:
    return {"check": f.check, "status": f.status.value, "detail": f.detail, "fix": f.fix}
