"""Can a TrainingJob run on Kubernetes? Every reason it cannot, with its field path."""

from __future__ import annotations

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec.models import TrainingJob


def cluster_errors(job: TrainingJob) -> list[FieldError]:
    """Why ``job`` cannot run on Kubernetes (empty: it can)."""
    s = job.spec
    errors = []
    if not s.image:
        errors.append(FieldError("spec.image", "required on Kubernetes: the container image"))
    ckpt = s.checkpoint.dir
    mounts = [v.mount_path for v in s.volumes]
    if not ckpt:
        errors.append(
            FieldError(
                "spec.checkpoint.dir",
                "required on Kubernetes, or checkpoints die with the pod: a path under one of "
                "spec.volumes[*].mountPath, or an fsspec URI such as s3://bucket/path",
            )
        )
    elif "://" not in ckpt and not any(_is_under(ckpt, m) for m in mounts):
        errors.append(
            FieldError(
                "spec.checkpoint.dir",
                f"{ckpt} is not on a volume; mount one (spec.volumes) at a parent directory "
                "or use an fsspec URI",
            )
        )
    gpu = s.resources.gpu
    if gpu and gpu % s.procs_per_node:
        errors.append(
            FieldError(
                "spec.resources.gpu",
                f"{gpu} GPUs per node cannot be divided among {s.procs_per_node} processes",
            )
        )
    return errors


def require_cluster_ready(job: TrainingJob) -> None:
    """Raise UserInputError (exit 2) listing every reason ``job`` cannot run on Kubernetes."""
    errors = cluster_errors(job)
    if errors:
        raise UserInputError(errors)


def _is_under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")
