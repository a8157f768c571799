"""``gpufleet submit | status | logs | cancel``: a job on a Kubernetes cluster."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import typer

from gpufleet.cli.common import Output, fail, reported
from gpufleet.cli.render import TargetOption, load_and_render
from gpufleet.cli.validate import SetOption
from gpufleet.cluster import Cluster
from gpufleet.cluster.imagecheck import image_problems
from gpufleet.console import err_console, print_json
from gpufleet.errors import FieldError, UserInputError

NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (default: the kubeconfig context's)."),
]
ContextOption = Annotated[str | None, typer.Option(help="kubeconfig context to use.")]
NameArg = Annotated[str, typer.Argument(help="The job's metadata.name.")]
# A job with no pods in these phases has not run (or waits to run again: --kept shows its
# earlier tries' logs); in any other, its ranks' logs were kept beside its checkpoints.
NOT_STARTED = ("Queued", "Pending", "Suspended")


def submit(
    file: Annotated[str, typer.Argument(help="A TrainingJob or InferenceService YAML file.")],
    target: TargetOption = None,
    set_: SetOption = None,
    namespace: NamespaceOption = None,
    context: ContextOption = None,
) -> None:
    """Render a spec for TARGET and create its objects on the cluster."""
    job, objects = load_and_render(file, target, set_)
    if namespace and job.metadata.namespace and namespace != job.metadata.namespace:
        # kubectl's rule: an object's own namespace is never silently overridden
        fail(UserInputError([FieldError("metadata.namespace", (
            f"the spec says {job.metadata.namespace!r} but --namespace says {namespace!r}; "
            "drop one or make them agree"))]))  # fmt: skip
    with reported():
        cluster = Cluster.connect(namespace or job.metadata.namespace, context)
        for created in cluster.submit(objects):
            err_console.print(f"created {created}")
    err_console.print(f"next: gpufleet status {job.metadata.name} -n {cluster.namespace}")


def status(
    name: NameArg,
    namespace: NamespaceOption = None,
    context: ContextOption = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json")] = Output.text,
    pods: Annotated[
        bool, typer.Option("--pods", help="Then a line per pod: node, phase, restarts, exit.")
    ] = False,
) -> None:
    """One line: phase, pods, and why a job or service is not running (Kueue, scheduler...)."""
    with reported():
        result = Cluster.connect(namespace, context).status(name)
    if output is Output.json:
        print_json(result.as_dict())
    else:
        print(result.line())
        for resize in getattr(result, "resizes", [])[:-1]:  # the last is in the line
            print(f"  {resize}")
        for state in getattr(result, "pod_states", []) if pods else []:
            print(f"  {state.line()}")


def logs(
    name: NameArg,
    namespace: NamespaceOption = None,
    context: ContextOption = None,
    pod: Annotated[str | None, typer.Option(help="Only this pod.")] = None,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines of each pod.")] = None,
    kept: Annotated[
        bool, typer.Option("--kept", help="The logs the ranks kept beside the checkpoints.")
    ] = False,
) -> None:
    """Print the logs of the job's pods, each line prefixed with its pod. Once the pods are
    gone (or with --kept): every rank's log kept beside the checkpoints, every try's."""
    with reported():
        if kept and pod is not None:
            raise UserInputError([FieldError("--pod", "not with --kept (every pod's are shown)")])
        cluster = Cluster.connect(namespace, context)
        lines: Iterable[str] = []
        if kept:
            lines = cluster.kept_logs(name, tail=tail)
        elif pod is None and not cluster.pods(name):
            phase = cluster.status(name).phase
            if phase in NOT_STARTED:  # nothing can have been kept: no reader pod
                err_console.print(f"{name} has no pods: {phase} (--kept: earlier tries' logs)")
            else:
                err_console.print(f"{name} has no pods ({phase}): the logs its ranks kept")
                lines = cluster.kept_logs(name, tail=tail)
        else:
            lines = cluster.logs(name, tail=tail, pod=pod)
        for line in lines:
            print(line)
        if not kept:  # an image that cannot run the pods: what it lacks, in one line
            for problem, where in image_problems(cluster.pods(name)).items():
                err_console.print(f"pod {where[0]}: {problem}", markup=False)


def cancel(name: NameArg, namespace: NamespaceOption = None, context: ContextOption = None) -> None:
    """Delete the job (its pods, Service, PodMonitor), or an InferenceService's objects."""
    with reported():
        for deleted in Cluster.connect(namespace, context).cancel(name):
            err_console.print(f"deleted {deleted}")
