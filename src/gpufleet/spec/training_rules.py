"""Cross-field rules of a TrainingJob spec that span its sections: what spec.parallelism and
spec.framework allow of the rest. ``TrainingJobSpec.cross_field_problems`` calls them; each
returns one problem per field path (the loader reports them beside the fields' own errors)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from gpufleet.spec.validation import Problem, raw_int
from gpufleet.spec.workloads import WORKLOAD_KINDS

# The frameworks a job's workers may use (spec.framework; the default: DEFAULT_FRAMEWORK). Each
# has its targets in gpufleet.render.FRAMEWORK_TARGETS and, but PyTorch, its worker in
# gpufleet.frameworks (tests/unit/test_tf_parts.py holds the three together).
Framework = Literal["pytorch", "tensorflow", "ray", "horovod"]
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
FRAMEWORK_HELP = (
    "What the workers run on. pytorch: torchrun's workers (a command, or any built-in "
    "workload). tensorflow: one worker per node with tf.distribute.MultiWorkerMirroredStrategy "
    "and its TF_CONFIG (a command, or workload digits in Keras); targets job, jobset and "
    "tfjob. ray: a Ray cluster of spec.nodes nodes and a driver (a command, or workload digits "
    "with Ray Train's TorchTrainer); target rayjob. horovod: a Horovod PyTorch script (a command) "
    "on Horovod's Gloo controller, or under mpirun on target mpijob (docs/frameworks.md, "
    "Horovod)."
)
# Built-in workloads each other framework has a version of (gpufleet.frameworks.<name>).
FRAMEWORK_WORKLOADS: dict[str, tuple[str, ...]] = {
    "tensorflow": ("digits",),
    "ray": ("digits",),
    "horovod": (),  # a user's Horovod script: spec.command
}
# How each other framework spreads a model over its workers (why spec.parallelism is refused).
_REPLICATES = {
    "tensorflow": "replicates the model on every GPU (MultiWorkerMirroredStrategy)",
    "ray": "replicates the model on every worker (Ray Train's DDP)",
    "horovod": "replicates the model on every worker (hvd.DistributedOptimizer)",
}

# Why gpufleet's job metrics (spec.metrics.port) cannot come from a framework's workers.
_NO_JOB_METRICS = {
    "ray": "does not run; Ray exports its own (ray start's --metrics-export-port, 8080 under "
    "KubeRay)",
    "horovod": "cannot serve: a Horovod script writes none, and an MPIJob's ranks run without "
    "the pod launcher",
}


def parallelism_problems(data: dict[str, Any], has_command: bool) -> list[Problem]:
    """spec.parallelism applies to the built-in Trainer: refused with a command (the script
    may not use the Trainer, and a setting nothing applies would be silently lost), and the
    accumulation must split the workload's batch evenly."""
    from gpufleet.spec.training import Parallelism  # the section's own model and defaults

    raw = data.get("parallelism")
    if not isinstance(raw, dict) or not raw:
        return []
    # A default value sets nothing, so a command job may carry it (its own dump writes them all).
    defaults = Parallelism().model_dump(by_alias=True)
    if _non_default(raw, defaults) and has_command:
        return [(("parallelism",), "applies to built-in workloads (spec.workload), not to a "
                 "command: a script picks its own (gpufleet.runtime.Trainer(..., parallelism="
                 "ParallelismSettings(strategy='fsdp')), or its own fully_shard)")]  # fmt: skip
    accumulation = raw_int(data, "parallelism", "gradientAccumulation", default=1, minimum=1)
    workload = data.get("workload")
    if accumulation and isinstance(workload, dict) and workload.get("name") in WORKLOAD_KINDS:
        default = WORKLOAD_KINDS[workload["name"]].model_fields["batch_size"].default
        batch = raw_int(data, "workload", "batchSize", default=default, minimum=1)
        if batch and batch % accumulation:
            return [(("parallelism", "gradientAccumulation"), f"is {accumulation}, which does "
                     f"not divide spec.workload.batchSize {batch}: each micro-batch must have "
                     "the same size")]  # fmt: skip
    return []


def _non_default(raw: dict[str, Any], defaults: dict[str, Any]) -> bool:
    return any(key not in defaults or raw[key] != defaults[key] for key in raw)


def framework_problems(data: dict[str, Any]) -> list[Problem]:
    """What a job of another framework than PyTorch cannot have: each field PyTorch's runtime
    alone implements."""
    framework = data.get("framework")
    if not isinstance(framework, str) or framework not in FRAMEWORK_WORKLOADS:
        return []
    from gpufleet.spec.training import Parallelism

    label = f"spec.framework {framework}"
    problems: list[Problem] = []
    procs = raw_int(data, "procsPerNode", default=1, minimum=1)
    if framework == "tensorflow" and procs and procs != 1:
        problems.append((("procsPerNode",), f"is {procs}, but {label} runs one worker per node "
                         "(MultiWorkerMirroredStrategy uses all of a node's GPUs in it): set "
                         "1"))  # fmt: skip
    workload = data.get("workload")
    name = workload.get("name") if isinstance(workload, dict) else None
    if name in WORKLOAD_KINDS and not FRAMEWORK_WORKLOADS[framework]:
        problems.append((("workload",), f"{label} has no built-in workload: set spec.command "
                         "to a script and its arguments instead"))  # fmt: skip
    elif name in WORKLOAD_KINDS and name not in FRAMEWORK_WORKLOADS[framework]:
        problems.append((("workload", "name"), f"{name!r} has no {framework} version; {label} "
                         f"has: {', '.join(FRAMEWORK_WORKLOADS[framework])}"))  # fmt: skip
    raw = data.get("parallelism")
    if isinstance(raw, dict) and _non_default(raw, Parallelism().model_dump(by_alias=True)):
        problems.append((("parallelism",), f"is PyTorch's (DDP/FSDP2, bf16, accumulation); "
                         f"{label} {_REPLICATES[framework]}: remove it"))  # fmt: skip
    if data.get("minNodes") is not None:
        problems.append((("minNodes",), f"elastic world sizes are torchrun's; {label} runs on "
                         "a fixed number of workers: remove it"))  # fmt: skip
    if data.get("onNonFinite") == "rollback":
        problems.append((("onNonFinite",), f"rollback is the PyTorch Trainer's; {label} stops "
                         "at a NaN/Inf loss (fail)"))  # fmt: skip
    metrics = data.get("metrics")
    if framework in _NO_JOB_METRICS and isinstance(metrics, dict) and metrics.get("port"):
        problems.append((("metrics", "port"), "gpufleet's job metrics come from its launcher, "
                         f"which {label} {_NO_JOB_METRICS[framework]}: remove it"))  # fmt: skip
    return problems + _checkpoint_problems(data, label)


def _checkpoint_problems(data: dict[str, Any], label: str) -> list[Problem]:
    checkpoint = data.get("checkpoint")
    checkpoint = checkpoint if isinstance(checkpoint, dict) else {}
    uri = checkpoint.get("dir")
    problems: list[Problem] = []
    if isinstance(uri, str) and "://" in uri and not uri.startswith("file://"):
        problems.append((("checkpoint", "dir"), f"{label} writes checkpoints to a filesystem "
                         "(a local directory or a mounted volume), not an object "
                         "store"))  # fmt: skip
    if checkpoint.get("durable") is not None:
        problems.append((("checkpoint", "durable"), "the durable tier's uploader is "
                         f"gpufleet's PyTorch runtime's; {label} checkpoints to one place: "
                         "put it in spec.checkpoint.dir"))  # fmt: skip
    if checkpoint.get("async") is True:
        problems.append((("checkpoint", "async"), "asynchronous saves are "
                         f"torch.distributed.checkpoint's; {label} saves "
                         "synchronously"))  # fmt: skip
    return problems


def exact_problems(data: dict[str, Any]) -> list[Problem]:
    """spec.parallelism.exactAcrossWorldSizes: DDP without accumulation (each shard is a
    micro-batch), and shards a power of two that every world size of the job (minNodes..nodes
    nodes x procsPerNode) divides and that cuts the first run's global batch evenly; shards
    only with the mode."""
    raw = data.get("parallelism")
    if not isinstance(raw, dict):
        return []
    where = ("parallelism", "shards")
    if raw.get("exactAcrossWorldSizes") is not True:
        if raw.get("shards") is not None:
            return [(where, "applies only with spec.parallelism.exactAcrossWorldSizes: true")]
        return []
    problems: list[Problem] = []
    if raw.get("strategy", "ddp") != "ddp":
        problems.append((("parallelism", "strategy"), f"is {raw['strategy']}: "
                         "exactAcrossWorldSizes needs ddp (FSDP reduce-scatters in an order "
                         "the world size decides)"))  # fmt: skip
    if raw_int(data, "parallelism", "gradientAccumulation", default=1) not in (1, None):
        problems.append((("parallelism", "gradientAccumulation"), "must be 1 with "
                         "exactAcrossWorldSizes: each shard is a micro-batch already"))  # fmt: skip
    nodes = raw_int(data, "nodes", default=1, minimum=1)
    low = raw_int(data, "minNodes", default=nodes or 1, minimum=1) or 1
    procs = raw_int(data, "procsPerNode", default=1, minimum=1)
    shards = raw_int(data, *where, default=(nodes or 0) * (procs or 0), minimum=1)
    if not (nodes and procs and shards):
        return problems  # a field's own error says what is wrong
    said = "is" if "shards" in raw else f"defaults to nodes x procsPerNode ({nodes} x {procs}) ="
    if shards & (shards - 1):
        return [*problems, (where, f"{said} {shards}, not a power of two: set a power of two "
                            "that every world size of the job divides")]  # fmt: skip
    apart = [n * procs for n in range(low, nodes + 1) if shards % (n * procs)]
    if apart:
        problems.append((where, f"{said} {shards}, which a world size of the job does not "
                         f"divide ({', '.join(map(str, apart))} workers): every node count in "
                         "minNodes..nodes times procsPerNode must divide it"))  # fmt: skip
    return problems + _exact_batch_problems(data, shards, low * procs)  # the strictest


def _exact_batch_problems(data: dict[str, Any], shards: int, world: int) -> list[Problem]:
    """The first run's global batch (batchSize x its workers, at least ``world``) must cut into
    ``shards``."""
    workload = data.get("workload")
    if not isinstance(workload, dict) or workload.get("name") not in WORKLOAD_KINDS:
        return []
    default = WORKLOAD_KINDS[workload["name"]].model_fields["batch_size"].default
    batch = raw_int(data, "workload", "batchSize", default=default, minimum=1)
    if batch and (batch * world) % shards:
        return [(("workload", "batchSize"), f"is {batch}: {world} workers' global batch of "
                 f"{batch * world} does not cut into {shards} equal shards "
                 "(spec.parallelism.shards)")]  # fmt: skip
    return []
