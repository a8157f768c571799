"""``gpufleet validate FILE``: check a spec and report every problem with its field path."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.common import Output, fail, load_any
from gpufleet.console import err_console, print_json
from gpufleet.errors import FieldError, GpufleetError, UserInputError
from gpufleet.kube import Obj
from gpufleet.spec import InferenceService

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: --set spec.nodes=2 (repeatable)."),
]


def validate(
    file: Annotated[str, typer.Argument(help="A TrainingJob or InferenceService YAML file.")],
    set_: SetOption = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json")] = Output.text,
    target: Annotated[
        str | None,
        typer.Option(
            help="Also check it can run on this cluster target (image, checkpoint volume, the "
            "names its controller derives: `gpufleet render --help` lists the targets)."
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            help="With --target: also check that this namespace of the current kubeconfig's "
            "cluster admits its pods (Pod Security: RDMA workers need an rdma tenant).",
        ),
    ] = None,
) -> None:
    """Validate a spec: exit 0 if it is valid, 2 with every error (field path, line) if not."""
    if namespace is not None and target is None:
        fail(UserInputError([FieldError("--namespace", "needs --target (what to check there)")]))
    if target is not None:
        from gpufleet.cli.render import load_and_render  # it imports this module

        job, objects = load_and_render(file, target, set_)
        if namespace is not None:
            _check_namespace(objects, namespace)
    else:
        job = load_any(file, set_)
    if output is Output.json:
        print_json({"valid": True, "job": job.model_dump(mode="json", by_alias=True)})
        return
    if isinstance(job, InferenceService):
        m, r = job.spec.model, job.spec.replicas
        where = m.repository or f"pvc {m.pvc.claim_name}/{m.pvc.sub_path}"  # type: ignore[union-attr]
        err_console.print(
            f"{file}: valid InferenceService {job.metadata.name!r}: model "
            f"{m.name} from {where}, {r.min}-{r.max} replica(s)"
        )
        return
    s = job.spec
    what = s.workload.name if s.workload else " ".join(s.command or [])
    err_console.print(
        f"{file}: valid TrainingJob {job.metadata.name!r}: {what} on {s.nodes} node(s) x "
        f"{s.procs_per_node} process(es)"
    )
    from gpufleet.launch.worker import local_notes

    for note in [*local_notes(job), *([] if target else s.env_warnings())]:  # render warned
        err_console.print(note)


def _check_namespace(objects: list[Obj], namespace: str) -> None:
    """What `submit` checks of the namespace before creating anything (exit 2 if refused)."""
    from gpufleet.cluster import Cluster
    from gpufleet.cluster.admission import check_pod_security

    placed = [{**o, "metadata": {**o["metadata"], "namespace": namespace}} for o in objects]
    try:
        check_pod_security(Cluster.connect(namespace).core, placed)
    except GpufleetError as exc:
        fail(exc)
