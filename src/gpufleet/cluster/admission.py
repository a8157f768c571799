"""Before anything is created: would the namespace's Pod Security admit the job's pods? An RDMA
worker adds IPC_LOCK, which a tenant enforcing "restricted" refuses pod by pod (its controller
would retry for ever, the job never starting); only a namespace the chart made for RDMA
(label gpufleet.dev/rdma) takes it."""

from __future__ import annotations

from typing import Any

from gpufleet.cluster.access import as_dict
from gpufleet.cluster.apierrors import api_errors, status_code, to_cluster_error
from gpufleet.cluster.doctor.requirements import POD_SECURITY_ENFORCE
from gpufleet.console import err_console
from gpufleet.errors import FieldError, UserInputError
from gpufleet.kube import LABEL_RDMA, Obj
from gpufleet.render.podsecurity import RDMA_CAPABILITY, pod_specs_in


def adds_rdma_capability(obj: Obj) -> bool:
    """Whether a pod of ``obj`` (a rendered job) adds the RDMA capability."""
    return any(
        RDMA_CAPABILITY
        in ((c.get("securityContext") or {}).get("capabilities") or {}).get("add", [])
        for _, pod in pod_specs_in(obj)
        for c in pod.get("containers") or []
    )


def check_pod_security(core: Any, objects: list[Obj]) -> None:
    """UserInputError (spec.rdma, exit 2) when a namespace of ``objects`` would refuse their
    RDMA workers; ``core``: CoreV1Api's
    methods (cluster/builtin.py)."""
    for ns in sorted({o["metadata"]["namespace"] for o in objects if adds_rdma_capability(o)}):
        try:
            labels = as_dict(core.read_namespace(ns))["metadata"].get("labels") or {}
        except api_errors() as exc:
            if status_code(exc) == 403:  # a user who may not read it: admission will tell
                note = f"note: cannot read namespace {ns}'s Pod Security level (forbidden)"
                err_console.print(note + "; its RDMA workers are checked when created")
                continue
            raise to_cluster_error(exc, f"read namespace {ns}") from exc
        level = labels.get(POD_SECURITY_ENFORCE, "privileged")  # the default without the label
        if labels.get(LABEL_RDMA) == "true" or level == "privileged":
            continue
        raise UserInputError([FieldError("spec.rdma", (
            f"namespace {ns} enforces Pod Security {level!r}, which refuses the {RDMA_CAPABILITY} "
            "capability RDMA workers add: submit to a tenant the chart made with rdma: true "
            f"(label {LABEL_RDMA}); nothing was created"))])  # fmt: skip
