"""``gpufleet elastic-controller``: grow elastic jobs into free quota, readmit evicted ones at
the size that fits (gpufleet.cluster.elastic; the chart runs it, docs/parallelism.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.common import fail, stop_on_signals
from gpufleet.cli.jobs import ContextOption
from gpufleet.errors import FieldError, UserInputError
from gpufleet.extras import require
from gpufleet.spec.units import parse_duration


def elastic_controller(
    interval: Annotated[str, typer.Option(help="Time between rounds, e.g. 2s.")] = "2s",
    once: Annotated[bool, typer.Option("--once", help="One round, then exit.")] = False,
    context: ContextOption = None,
) -> None:
    """Resize elastic Jobs (spec.minNodes with spec.queue, target job) within their node
    range: grow into free quota, and set a job that waits to the size that fits."""
    require("cluster", "kubernetes", what="the elastic controller")
    from gpufleet.cluster.client import Cluster
    from gpufleet.cluster.elastic_loop import one_round, run

    try:
        seconds = parse_duration(interval)
    except ValueError as exc:
        fail(UserInputError([FieldError("--interval", str(exc))]))
    if seconds <= 0:
        fail(UserInputError([FieldError("--interval", f"is {interval}: must be above 0")]))
    cluster = Cluster.connect(context=context)
    if once:
        one_round(cluster.custom)
        return
    run(cluster.custom, stop_on_signals(), seconds)
