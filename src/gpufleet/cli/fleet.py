"""``gpufleet jobs`` and ``gpufleet queues``: the whole fleet the caller may read, in one
namespace or in all (``-A``); without a cluster, ``jobs`` lists the local runs.

Text fits the terminal (80 columns when it is not one): a table, then each waiting job's
reason wrapped below it. ``-o json`` prints one object with every field.
"""

from __future__ import annotations

import datetime as dt
import textwrap
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.padding import Padding
from rich.table import Table

from gpufleet.cli.common import Output, RunRootOption, fail, reported
from gpufleet.cli.jobs import ContextOption, NamespaceOption
from gpufleet.cluster import Cluster
from gpufleet.cluster.fleet import read_visible
from gpufleet.cluster.jobrows import age, fleet_rows
from gpufleet.cluster.progress import duration
from gpufleet.cluster.queues import counts, waiting_jobs
from gpufleet.console import camel_json, err_console, print_json
from gpufleet.errors import UserInputError
from gpufleet.launch.runs import age_of, local_runs
from gpufleet.launch.worker import DEFAULT_RUN_ROOT

# Where results go: a table is the result (stdout), as print_json's object is.
out_console = Console(highlight=False, markup=False, soft_wrap=False)
AllOption = Annotated[
    bool, typer.Option("--all-namespaces", "-A", help="Every namespace the caller may read.")
]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="text or json")]
LocalOption = Annotated[
    bool, typer.Option("--local", help="The local runs (the default without a cluster).")
]


def table(headers: list[str], rows: list[list[str]], indent: int = 0) -> None:
    """Columns separated by two spaces, no borders, folded to fit the terminal."""
    grid = Table(*headers, box=None, show_edge=False, pad_edge=False, header_style="",
                 padding=(0, 2, 0, 0))  # fmt: skip
    for column in grid.columns:
        column.overflow = "fold"
    for row in rows:
        grid.add_row(*row)
    out_console.print(Padding(grid, (0, 0, 0, indent), expand=False) if indent else grid)


def notes(title: str, lines: list[tuple[str, str]]) -> None:
    """``title``, then each ``who: text`` wrapped to the terminal's width."""
    if not lines:
        return
    out_console.print(f"\n{title}")
    for who, text in lines:
        wrapped = textwrap.wrap(f"{who}: {text}", width=out_console.width - 2,
                                subsequent_indent="    ", break_on_hyphens=False)  # fmt: skip
        out_console.print("\n".join(f"  {line}" for line in wrapped))


def progress(step: int | None, steps: int | None, eta: float | None, *, percent: bool) -> str:
    """``40% ~1 min`` (``percent``) or ``40/100 ~1 min``; ``step 40`` without a total."""
    if step is None:
        return "-"
    done = (
        f"step {step}" if not steps else f"{100 * step // steps}%" if percent else f"{step}/{steps}"
    )
    return f"{done} ~{duration(eta)}" if eta is not None else done


def jobs(
    namespace: NamespaceOption = None,
    all_namespaces: AllOption = False,
    context: ContextOption = None,
    output: OutputOption = Output.text,
    local: LocalOption = False,
    run_root: RunRootOption = DEFAULT_RUN_ROOT,
) -> None:
    """Every gpufleet job: target, queue, phase, progress, restarts, age, and why each waiting
    one waits. Without a cluster (no kubeconfig), the local runs under --run-root."""
    asked = bool(namespace or context or all_namespaces)
    cluster = None if local else connect_or_local(namespace, context, run_root, asked=asked)
    if cluster is None:
        _local(run_root, output)
        return
    with reported():
        fleet, note = read_visible(cluster.custom, cluster.core, cluster.namespace,
                                   all_namespaces=all_namespaces)  # fmt: skip
        rows = fleet_rows(fleet, dt.datetime.now(dt.UTC), cluster.job_metrics)
    if note:
        err_console.print(f"note: {note}")
    if output is Output.json:
        shown = None if all_namespaces and not note else cluster.namespace
        print_json({"jobs": [r.as_dict() for r in rows], "namespace": shown})
        return
    if not rows:
        where = "any namespace" if all_namespaces and not note else f"namespace {cluster.namespace}"
        err_console.print(f"no gpufleet jobs in {where}")
        return
    spread = len({r.namespace for r in rows}) > 1 or (all_namespaces and not note)
    table(
        [*(["NAMESPACE"] if spread else []), "NAME", "TARGET", "QUEUE", "PHASE", "PROGRESS",
         "RESTARTS", "AGE"],
        [[*([r.namespace] if spread else []), r.name, r.target, r.queue or "-", r.phase,
          progress(r.step, r.steps, r.eta_seconds, percent=True), str(r.restarts),
          age(r.age_seconds)] for r in rows],
    )  # fmt: skip
    notes("Waiting:", [(f"{r.namespace}/{r.name}" if spread else r.name, r.reason)
                       for r in rows if r.reason])  # fmt: skip
    notes("Elastic:", [(f"{r.namespace}/{r.name}" if spread else r.name,
                        "; ".join([f"size {r.size}", *r.resizes[-1:]]))
                       for r in rows if r.size])  # fmt: skip


def connect_or_local(
    namespace: str | None, context: str | None, run_root: Path, *, asked: bool
) -> Cluster | None:
    """The cluster of the kubeconfig; None (the local runs, said on stderr) when there is no
    kubeconfig or no kubernetes client: the embedded default has no cluster. ``asked``: a
    cluster option was given (a namespace, a context), so no cluster is an error (exit 2)."""
    try:
        return Cluster.connect(namespace, context)
    except UserInputError as exc:
        if asked or not {e.path for e in exc.errors} & {"KUBECONFIG", "kubernetes"}:
            fail(exc)
        err_console.print(f"no cluster ({exc.errors[0].message}): the local runs under {run_root}")
        return None


def _local(run_root: Path, output: Output) -> None:
    runs = local_runs(run_root)
    if output is Output.json:
        print_json({"runs": [r.as_dict() for r in runs], "runRoot": str(run_root)})
        return
    if not runs:
        err_console.print(f"no local runs under {run_root}")
        return
    now = time.time()
    table(["NAME", "STATE", "PROGRESS", "LOSS", "RESTARTS", "STARTED"],
          [[r.name, r.state, progress(r.step, r.steps, r.eta_seconds, percent=False),
            "-" if r.loss is None else f"{r.loss:.4g}", str(r.restarts),
            f"{age(age_of(r, now))} ago" if r.started else "-"] for r in runs])  # fmt: skip


def queues(
    namespace: NamespaceOption = None,
    all_namespaces: AllOption = False,
    context: ContextOption = None,
    output: OutputOption = Output.text,
) -> None:
    """Kueue's ClusterQueues (quota per flavor: nominal, used, borrowed, lendable) and
    LocalQueues the caller sees, and the position of each of the caller's waiting jobs."""
    with reported():
        cluster = Cluster.connect(namespace, context)
        fleet, note = read_visible(cluster.custom, cluster.core, cluster.namespace,
                                   all_namespaces=all_namespaces, jobs=False)  # fmt: skip
    if note:
        err_console.print(f"note: {note}")
    cqs = [counts(q, local=False) for q in fleet.cluster_queues or []]
    lqs = [counts(q, local=True) for q in fleet.local_queues]
    waiting = waiting_jobs(fleet, dt.datetime.now(dt.UTC))
    if output is Output.json:
        readable = fleet.cluster_queues is not None
        print_json(camel_json({"cluster_queues": cqs if readable else None, "local_queues": lqs,
                               "waiting": waiting}))  # fmt: skip
        return
    _print_queues(cqs, lqs, waiting, readable=fleet.cluster_queues is not None)


def _print_queues(cqs: list[Any], lqs: list[Any], waiting: list[Any], *, readable: bool) -> None:
    if not readable:
        err_console.print("note: ClusterQueues not readable here (forbidden, or no Kueue)")
    for cq in cqs:
        cohort = f" (cohort {cq.cohort})" if cq.cohort else ""
        out_console.print(f"ClusterQueue {cq.name}{cohort}: {cq.pending} pending, "
                          f"{cq.admitted} admitted" + (f"; INACTIVE: {cq.inactive}"
                                                       if cq.inactive else ""))  # fmt: skip
        table(["FLAVOR", "RESOURCE", "NOMINAL", "USED", "BORROWED", "LENDABLE"],
              [[f.flavor, f.resource, f.nominal, f.used, f.borrowed, f.lendable]
               for f in cq.quota], indent=2)  # fmt: skip
    if lqs:
        out_console.print("LocalQueues:")
        table(["NAMESPACE", "NAME", "CLUSTERQUEUE", "PENDING", "ADMITTED"],
              [[q.namespace or "-", q.name, q.cluster_queue or "-", str(q.pending),
                str(q.admitted)] for q in lqs], indent=2)  # fmt: skip
    if not (cqs or lqs):
        err_console.print("no Kueue queues here")
    if waiting:
        out_console.print("Waiting, in Kueue's order:")
        table(["POSITION", "NAMESPACE", "JOB", "CLUSTERQUEUE", "PRIORITY", "WAITED"],
              [["-" if w.position is None else f"{'' if w.exact else '>='}{w.position} of {w.of}",
                w.namespace, w.job,
                w.cluster_queue or "-", str(w.priority), age(w.waited_seconds)]
               for w in waiting], indent=2)  # fmt: skip
        notes("Why:", [(f"{w.namespace}/{w.job}", w.reason) for w in waiting])
