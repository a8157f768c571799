"""A benchmark as a TrainingJob: the worker command swapped into a spec that already says
where and how wide to run (image, volumes, queue, nodes), or a plain local one. Pure, but for
``publish`` (what a worker calls to hand its results over)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec import TrainingJob, validate_training_job

# The option of each spec path a local job's error names (--procs 0 and the like).
FLAGS = {"spec.procsPerNode": "--procs", "spec.nodes": "--nodes"}


def local_job(name: str, *, nodes: int, procs_per_node: int, gpus: int) -> TrainingJob:
    """A job that runs on this machine only: no image, no volumes."""
    doc: dict[str, Any] = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "command": ["-m", "placeholder"],
            "nodes": nodes,
            "procsPerNode": procs_per_node,
            "resources": {"gpu": gpus},
        },
    }
    return validate_training_job(doc)


def base_job(spec: TrainingJob | None, *, nodes: int, procs: int, cuda: bool) -> TrainingJob:
    """The job a benchmark starts from: ``spec``, or one on this machine (``nodes`` x ``procs``
    workers, a GPU each when ``cuda``) whose errors name the CLI's options."""
    if spec is not None:
        return spec
    try:
        return local_job(
            "collectives", nodes=nodes, procs_per_node=procs, gpus=procs if cuda else 0
        )
    except UserInputError as exc:  # --procs 0 and the like, with the spec's words
        raise UserInputError(
            [FieldError(FLAGS.get(e.path, e.path), e.message) for e in exc.errors]
        ) from None


def bench_job(
    base: TrainingJob, name: str, module: str, args: list[str], *, parallelism: bool = False
) -> TrainingJob:
    """``base`` running ``python -m module args`` instead of its own command or workload: no
    restarts (a benchmark restarted halfway measures nothing), and no parallelism settings
    unless ``parallelism`` (a benchmark that trains with the Trainer keeps the spec's)."""
    spec = base.spec.model_copy(
        update={
            "command": ["-m", module, *args],
            "workload": None,
            "parallelism": base.spec.parallelism if parallelism else type(base.spec.parallelism)(),
            "max_restarts": 0,
            "hang_timeout": 0.0,  # a 1 GiB all-to-all on CPU may take minutes per size
        }
    )
    metadata = base.metadata.model_copy(update={"name": name})
    return base.model_copy(update={"spec": spec, "metadata": metadata})


def shared_results(base: TrainingJob, name: str) -> str | None:
    """Where a rendered benchmark's pods publish results for ``gpufleet bench collect``: the
    spec's checkpoint directory (the shared volume, or S3), under ``bench-<name>``."""
    root = base.spec.checkpoint.dir
    return f"{root.rstrip('/')}/bench-{name}" if root else None


def publish(files: list[Path], results: str) -> None:
    """Copy ``files`` into ``results`` (a directory or an fsspec URI such as s3://...), each
    whole, so a reader finds a file complete or not at all."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(results)
    fs.makedirs(root, exist_ok=True)
    for path in files:
        fs.put_file(str(path), f"{root.rstrip('/')}/{path.name}")
