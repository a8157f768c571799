"""The user-facing kinds as pydantic models. The local backend and the renderers read these."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from gpufleet.runtime.context import (
    CHECKPOINT_DEFAULTS,
    MAX_ROLLBACKS,
    PARALLELISM_DEFAULTS,
    CheckpointSettings,
    ParallelismSettings,
)
from gpufleet.spec.units import parse_duration, parse_quantity

API_VERSION = "gpufleet.dev/v1alpha1"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an environment variable's name

Duration = Annotated[float, BeforeValidator(parse_duration)]
Quantity = Annotated[str, BeforeValidator(parse_quantity)]


# Bounds of numbers that end up in Kubernetes objects (int32 fields such as backoffLimit and
# replicas; an Indexed Job has at most 100000 completions) or in a worker's command line.
INT32_MAX = 2**31 - 1
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024  # torchrun's --nproc-per-node; the largest GPU servers have 16
MAX_BATCH = 1 << 20  # samples per step per process

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # also a key's name
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _kubernetes_name(
    pattern: re.Pattern[str], what: str, ends: str = "starting and ending with a letter or digit"
) -> AfterValidator:
    """A validator for a Kubernetes name or label value: at most 63 characters of ``what``."""

    def check(value: str) -> str:
        if len(value) > 63 or not pattern.match(value):
            raise ValueError(f"must be a {what}, {ends}, got {value!r}")
        return value

    return AfterValidator(check)


DnsLabel = Annotated[
    str,
    _kubernetes_name(_DNS_LABEL, "DNS-1123 label: at most 63 lowercase letters, digits or '-'"),
]
# A job's or service's name: it also names a Service (headless for rendezvous, or the serving
# one) and the controllers' Services, which must be DNS-1035 labels (a leading digit is refused).
ObjectName = Annotated[
    str,
    _kubernetes_name(
        _DNS_1035,
        "DNS-1035 label (it names Services): at most 63 lowercase letters, digits or '-'",
        "starting with a letter and ending with a letter or digit",
    ),
]
LabelValue = Annotated[
    str,
    _kubernetes_name(
        _LABEL_VALUE, "Kubernetes label value: at most 63 letters, digits, '-', '_' or '.'"
    ),
]


class SpecModel(BaseModel):
    """Base of every spec object: camelCase keys, unknown fields rejected, strict types."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        strict=True,
        frozen=True,
    )


Loc = tuple[str | int, ...]
CROSS_FIELD = "cross_field"  # the pydantic error type of a cross-field problem
Problem = tuple[Loc, str]  # (path under the model, as keys are written; what is wrong)


def raw_int(data: dict[str, Any], *path: str, default: int, minimum: int = 0) -> int | None:
    """The integer at ``path`` in a raw document (``default`` when absent); None when it is not
    a valid integer there, which the field's own validation reports."""
    value: Any = data
    for key in path:
        if not isinstance(value, dict):
            return None  # not a mapping where one belongs: its field error says so
        if key not in value:
            return default
        value = value[key]
    if type(value) is not int or value < minimum:
        return None
    return value


class CrossFieldModel(SpecModel):
    """A spec object with rules across its fields (Kueue's field.ErrorList habit): each rule
    yields one problem at its own path, and the rules read the raw document, so they run and are
    reported together with the fields' own errors even when some field is invalid."""

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        """Problems across fields of the raw ``data`` (keys as written); none by default."""
        return []

    @model_validator(mode="wrap")
    @classmethod
    def _cross_field_rules(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        problems = cls.cross_field_problems(data) if isinstance(data, dict) else []
        try:
            model = handler(data)
        except ValidationError as exc:
            if not problems:
                raise
            raise _errors(exc.title, exc.errors(), problems, data) from None
        if problems:
            raise _errors(cls.__name__, [], problems, data)
        return model


_PYDANTIC_ERRORS = frozenset(get_args(ErrorType))


def _errors(title: str, field_errors: Any, problems: list[Problem], data: Any) -> ValidationError:
    details: list[InitErrorDetails] = [
        {
            # A custom error (a nested model's cross-field one, an env value's) is re-created
            # with its words; pydantic's own types are named.
            "type": e["type"]
            if e["type"] in _PYDANTIC_ERRORS
            else PydanticCustomError(e["type"], e["msg"]),
            "loc": e["loc"],
            "input": e["input"],
            "ctx": e.get("ctx", {}),
        }
        for e in field_errors
    ]
    for loc, message in problems:
        value = data
        for key in loc:
            value = value.get(key) if isinstance(value, dict) else None
        details.append(
            {"type": PydanticCustomError(CROSS_FIELD, message), "loc": loc, "input": value}
        )
    return ValidationError.from_exception_data(title, details)


class Metadata(SpecModel):
    """Identity of a job."""

    name: ObjectName = Field(
        description="Job name; names the run directory and cluster objects (at most 63 "
        "characters, less on targets whose controllers add to it: `gpufleet validate --target`)."
    )
    namespace: DnsLabel | None = Field(
        default=None, description="Cluster only: the tenant namespace to submit to."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra labels on every object rendered. Keys gpufleet or a controller sets are "
            "refused: gpufleet.dev, kubernetes.io, k8s.io, x-k8s.io, kubeflow.org and "
            "volcano.sh domains (app.kubernetes.io/version and other keys gpufleet does not "
            "set are free); they select pods and attribute GPUs."
        ),
    )

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, value: dict[str, str]) -> dict[str, str]:
        problems = [p for key, v in value.items() if (p := label_problem(key, v))]
        if problems:
            raise ValueError("; ".join(problems))
        return value


# Label keys whose owners are gpufleet or the controllers it renders for: a user label with one
# would override gpufleet's own (the rendezvous Service would select no pod, GPU usage would be
# attributed to another job) or confuse a controller.
_RESERVED_DOMAINS = (
    "gpufleet.dev",
    "kubernetes.io",
    "k8s.io",
    "x-k8s.io",
    "kubeflow.org",
    "volcano.sh",
)
# app.kubernetes.io's recommended labels are the user's, except those gpufleet sets itself.
_OWN_APP_LABELS = frozenset({"name", "instance", "component", "part-of", "managed-by"})


def label_problem(key: str, value: str) -> str | None:
    """What is wrong with the label ``key: value`` (Kubernetes' syntax, gpufleet's reserved
    keys), or None."""
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_VALUE.match(name) or len(name) > 63:
        return (f"label key {key!r}: the name part must be at most 63 letters, digits, '-', "
                "'_' or '.', starting and ending with a letter or digit")  # fmt: skip
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"label key {key!r}: the prefix must be a DNS subdomain such as example.com"
    domain = next((d for d in _RESERVED_DOMAINS if prefix == d or prefix.endswith("." + d)), None)
    if domain and not (prefix == "app.kubernetes.io" and name not in _OWN_APP_LABELS):
        return (f"label key {key!r} is reserved ({domain} keys are set by gpufleet or a "
                "controller, and select its pods): use a key of your own domain")  # fmt: skip
    if value and (len(value) > 63 or not _LABEL_VALUE.match(value)):
        rule = "empty or at most 63 letters, digits, '-', '_' or '.', starting and ending"
        return f"label {key!r}: the value must be {rule} with a letter or digit, got {value!r}"
    return None


BATCH_SIZE_HELP = (
    "Samples per step per process. The global batch (this x workers) is fixed by the first "
    "run: a resume at another world size keeps the checkpoint's global batch and splits it."
)


class _WorkloadBase(SpecModel):
    """Fields every built-in workload has."""

    seed: int = Field(
        default=0, ge=0, le=2**63 - 1, description="Seed of model init, shuffling and dropout."
    )
    log_every: int = Field(
        default=25, ge=1, le=INT32_MAX, description="Print a progress line every N steps."
    )


class DigitsWorkload(_WorkloadBase):
    """Built-in: a small CNN on scikit-learn's bundled 8x8 digits data set (no download)."""

    name: Literal["digits"] = Field(description="Selects this workload.")
    steps: int = Field(default=300, ge=1, le=INT32_MAX, description="Optimizer steps to train.")
    batch_size: int = Field(default=32, ge=1, le=MAX_BATCH, description=BATCH_SIZE_HELP)
    lr: float = Field(default=0.05, gt=0, description="Peak learning rate (SGD, cosine decay).")


class SyntheticWorkload(_WorkloadBase):
    """Built-in: an MLP on random data, sized for benchmarks."""

    name: Literal["synthetic"] = Field(description="Selects this workload.")
    steps: int = Field(default=100, ge=1, le=INT32_MAX, description="Optimizer steps to train.")
    batch_size: int = Field(default=64, ge=1, le=MAX_BATCH, description=BATCH_SIZE_HELP)
    lr: float = Field(default=0.01, gt=0, description="Learning rate (AdamW).")
    input_size: int = Field(default=256, ge=1, le=1 << 16, description="Features per sample.")
    hidden_size: int = Field(default=1024, ge=1, le=1 << 16, description="Width of hidden layers.")
    layers: int = Field(default=4, ge=1, le=1024, description="Hidden layers.")
    samples: int = Field(
        default=4096, ge=1, le=1 << 24, description="Size of the synthetic data set."
    )


Workload = Annotated[DigitsWorkload | SyntheticWorkload, Field(discriminator="name")]


class Resources(SpecModel):
    """Per-node resources. Locally only ``gpu`` matters (it selects nccl); the rest is for pods."""

    cpu: Quantity | None = Field(default=None, description="CPU per node, e.g. '8' or '500m'.")
    memory: Quantity | None = Field(default=None, description="Memory per node, e.g. '32Gi'.")
    gpu: int = Field(
        default=0, ge=0, le=MAX_PROCS_PER_NODE, description="GPUs per node (nvidia.com/gpu)."
    )
    gpu_product: LabelValue | None = Field(
        default=None,
        description=(
            "Cluster only: run on nodes whose nvidia.com/gpu.product label (GPU feature "
            "discovery) has this value, e.g. NVIDIA-A30 or NVIDIA-H100-80GB-HBM3."
        ),
    )


class Checkpoint(SpecModel):
    """Where and how often the runtime checkpoints (torch.distributed.checkpoint)."""

    dir: str | None = Field(
        default=None,
        description="Directory or fsspec URI (s3://...). Default: <run dir>/checkpoints.",
    )
    every_steps: int = Field(
        default=CHECKPOINT_DEFAULTS.every_steps,
        ge=1,
        le=INT32_MAX,
        description="Checkpoint every N steps.",
    )
    keep: int = Field(
        default=CHECKPOINT_DEFAULTS.keep,
        ge=1,
        le=INT32_MAX,
        description="Complete checkpoints to keep (newest).",
    )
    async_save: bool = Field(
        default=CHECKPOINT_DEFAULTS.async_save,
        alias="async",
        description="Write in the background after staging to CPU memory.",
    )

    def settings(self, run_dir: Path) -> CheckpointSettings:
        """These fields as the runtime's settings for a job whose run directory is ``run_dir``,
        the directory resolved (``dir``, else <run_dir>/checkpoints) so every worker agrees."""
        return CheckpointSettings(
            dir=CheckpointSettings(dir=self.dir).root(run_dir),
            every_steps=self.every_steps,
            keep=self.keep,
            async_save=self.async_save,
        )


class Parallelism(SpecModel):
    """How the built-in Trainer spreads the model over the workers (docs/parallelism.md)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        default=PARALLELISM_DEFAULTS.strategy,  # type: ignore[arg-type]  # one of the literals
        description=(
            "ddp: every worker holds the whole model (DistributedDataParallel). fsdp: FSDP2 "
            "(fully_shard per block): parameters, gradients and optimizer state sharded over "
            "the workers, for models that do not fit one GPU."
        ),
    )
    mixed_precision: Literal["fp32", "bf16"] = Field(
        default=PARALLELISM_DEFAULTS.mixed_precision,  # type: ignore[arg-type]
        description=(
            "bf16: compute in bfloat16 (fsdp: bf16 parameters in forward and backward), "
            "gradients reduced and the optimizer stepped in fp32."
        ),
    )
    activation_checkpointing: bool = Field(
        default=PARALLELISM_DEFAULTS.activation_checkpointing,
        description="Recompute each block's activations in backward instead of keeping them.",
    )
    gradient_accumulation: int = Field(
        default=PARALLELISM_DEFAULTS.gradient_accumulation,
        ge=1,
        le=MAX_BATCH,
        description=(
            "Micro-batches per step: each worker's batch is split into this many, for less "
            "activation memory at the same batch size (it must divide workload.batchSize)."
        ),
    )

    def settings(self) -> ParallelismSettings:
        """These fields as the runtime's settings."""
        return ParallelismSettings(
            strategy=self.strategy,
            mixed_precision=self.mixed_precision,
            activation_checkpointing=self.activation_checkpointing,
            gradient_accumulation=self.gradient_accumulation,
        )


class Metrics(CrossFieldModel):
    """The job's Prometheus endpoint (step, throughput, loss, checkpoints, restarts)."""

    port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=(
            "Port of the job's /metrics (0: none). Locally `gpufleet run` serves every worker's "
            "metrics there on 127.0.0.1 for the whole run, restarts included; on Kubernetes each "
            "pod's launcher serves its workers' metrics on this port, and the pods carry "
            "prometheus.io/scrape annotations."
        ),
    )
    pod_monitor: bool = Field(
        default=False,
        description=(
            "On Kubernetes, also render a PodMonitor (Prometheus Operator) that scrapes the "
            "job's pods; needs spec.metrics.port."
        ),
    )

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        if data.get("podMonitor") is True and not data.get("port"):
            return [(("podMonitor",), "needs a port to scrape: set spec.metrics.port")]
        return []


class Preemption(SpecModel):
    """How a SIGTERM (node drain, Kueue preemption, Ctrl-C) is handled."""

    grace_period: Duration = Field(
        default=30.0,
        description="Seconds the workers get to take the preemption checkpoint before SIGKILL.",
    )


class Volume(SpecModel):
    """Cluster only: a PersistentVolumeClaim mounted into every worker."""

    name: DnsLabel = Field(description="Volume name.")
    mount_path: str = Field(description="Absolute path in the container.")
    claim_name: DnsLabel = Field(description="PersistentVolumeClaim to mount.")
    read_only: bool = Field(default=False, description="Mount read-only.")

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return value


_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")  # a Secret's or ConfigMap's data key


def _object_name(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"must be a Secret/ConfigMap name (a DNS subdomain), got {value!r}")
    return value


ObjectRefName = Annotated[str, AfterValidator(_object_name)]


class KeyRef(SpecModel):
    """One key of a Secret or ConfigMap, as Kubernetes' secretKeyRef/configMapKeyRef."""

    name: ObjectRefName = Field(description="The Secret's or ConfigMap's name.")
    key: str = Field(pattern=_CONFIG_KEY.pattern, description="The key in its data.")
    optional: bool = Field(default=False, description="Unset, not an error, when missing.")


class _OneOfTwo(CrossFieldModel):
    """A Kubernetes source of exactly one of two kinds (a Secret's or a ConfigMap's)."""

    KINDS: ClassVar[tuple[str, str]]  # the two fields, as written

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        if sum(data.get(k) is not None for k in cls.KINDS) != 1:
            return [((), f"set exactly one of {cls.KINDS[0]} or {cls.KINDS[1]}")]
        return []

    @property
    def ref(self) -> tuple[str, Any]:
        """(the kind as written, e.g. "secretKeyRef"; the reference)."""
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if info.alias in self.KINDS and value is not None:
                return info.alias, value
        raise AssertionError("validation ensures one kind is set")


class EnvSource(_OneOfTwo):
    """An environment value kept out of the spec: exactly one of the two references."""

    KINDS = ("secretKeyRef", "configMapKeyRef")
    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")


class NameRef(SpecModel):
    """A whole Secret or ConfigMap."""

    name: ObjectRefName = Field(description="The Secret's or ConfigMap's name.")
    optional: bool = Field(default=False, description="Nothing, not an error, when missing.")


class EnvFromSource(_OneOfTwo):
    """Every key of a Secret or ConfigMap as an environment variable, as Kubernetes' envFrom."""

    KINDS = ("secretRef", "configMapRef")
    secret_ref: NameRef | None = Field(default=None, description="A Secret.")
    config_map_ref: NameRef | None = Field(default=None, description="A ConfigMap.")
    prefix: str | None = Field(
        default=None, pattern=ENV_NAME.pattern, description="Prepended to each key."
    )


def _env_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "value"
    if isinstance(value, dict | EnvSource):
        return "valueFrom"
    return None


# An env entry: a plain string, or {secretKeyRef: ...} / {configMapKeyRef: ...}.
EnvValue = Annotated[
    Annotated[str, Tag("value")] | Annotated[EnvSource, Tag("valueFrom")],
    Discriminator(
        _env_kind,
        custom_error_type="env_value",
        custom_error_message=(
            "must be a string, or {secretKeyRef: {name, key}} or {configMapKeyRef: {name, key}}"
        ),
    ),
]
# Variable names whose plain values are credentials: they belong in a Secret.
CREDENTIAL_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE
)

# Programs that are not a training script: an interpreter or a launcher in command[0] would be
# run *by* torchrun's Python as if it were the script (FileNotFoundError '.../python').
_LAUNCHER = re.compile(r"^(python|pypy|ipython)[0-9.]*$|^(torchrun|bash|sh|env|uv|conda)$")


class TrainingJobSpec(CrossFieldModel):
    """What to run, how wide, and how it survives failures."""

    command: list[str] | None = Field(
        default=None,
        description=(
            "A user's script or module with its arguments, exactly torchrun's positional form: "
            "['train.py', '--lr', '0.1'] or ['-m', 'pkg.train']. Exclusive with workload."
        ),
    )
    workload: Workload | None = Field(
        default=None, description="A built-in workload instead of a command (digits, synthetic)."
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description=f"Nodes (elastic agents); at most {MAX_NODES} (an Indexed Job's limit).",
    )
    min_nodes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES,
        description=(
            "Elastic: the job goes on with as few as this many nodes (torchrun --nnodes "
            "minNodes:nodes), resuming on the new world size from its checkpoint. Targets job, "
            "jobset and pytorchjob (elasticPolicy); `gpufleet run` starts spec.nodes agents."
        ),
    )
    procs_per_node: int = Field(
        default=1, ge=1, le=MAX_PROCS_PER_NODE, description="Worker processes per node."
    )
    resources: Resources = Field(default_factory=Resources, description="Per-node resources.")
    env: dict[str, EnvValue] = Field(
        default_factory=dict,
        description=(
            "Extra environment variables: a string, or a reference kept out of the spec, "
            "{secretKeyRef: {name, key}} or {configMapKeyRef: {name, key}}, rendered as "
            "valueFrom. `gpufleet run` reads a reference from the variable of that name in its "
            "own environment, else the file .gpufleet/secrets/<name>/<key> (configmaps/ for a "
            "ConfigMap; the directory: $GPUFLEET_SECRETS_DIR)."
        ),
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        description=(
            "Every key of a Secret ({secretRef: {name}}) or ConfigMap ({configMapRef: {name}}) "
            "as a variable, as Kubernetes' envFrom; `gpufleet run` reads each file in "
            ".gpufleet/secrets/<name>/ (configmaps/). Not for the mpijob and trainjob targets."
        ),
    )
    checkpoint: Checkpoint = Field(default_factory=Checkpoint, description="Checkpointing.")
    parallelism: Parallelism = Field(
        default_factory=Parallelism,
        description=(
            "Built-in workloads: DDP or FSDP2, bf16, activation checkpointing, gradient "
            "accumulation. A command job's script chooses its own (Trainer(parallelism=...))."
        ),
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=INT32_MAX,
        description="Worker-group restarts before the job fails.",
    )
    hang_timeout: Duration = Field(
        default=300.0,
        description=(
            "Seconds without step progress before a worker is declared hung (0: off); "
            "must exceed the slowest step, a synchronous checkpoint save included. For a "
            "command job, set explicitly: progress is then any output line of the worker or "
            "a call of gpufleet.runtime.heartbeat()."
        ),
    )
    on_non_finite: Literal["fail", "rollback"] = Field(
        default="fail",
        description=(
            "Trainer jobs: what a NaN/Inf loss or weight does. fail: stop with exit 5 before it "
            "is checkpointed. rollback: reload the last checkpoint, skip the batch whose loss "
            f"went bad, and go on (at most {MAX_ROLLBACKS} times per run, then fail)."
        ),
    )
    preemption: Preemption = Field(default_factory=Preemption, description="Preemption.")
    metrics: Metrics = Field(default_factory=Metrics, description="Job metrics endpoint.")
    image: str | None = Field(default=None, description="Cluster only: container image.")
    queue: DnsLabel | None = Field(
        default=None,
        description="Cluster only: Kueue LocalQueue (target volcano: the Volcano Queue).",
    )
    priority: DnsLabel | None = Field(
        default=None,
        description=(
            "Cluster only: Kueue WorkloadPriorityClass (target volcano: the PriorityClass)."
        ),
    )
    volumes: list[Volume] = Field(default_factory=list, description="Cluster only: volumes.")

    @field_validator("command")
    @classmethod
    def _command_shape(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value or not value[0].strip():
            raise ValueError("must name a script or '-m module', got an empty command")
        if value[0] == "-m" and (len(value) < 2 or not value[1].strip()):
            raise ValueError("'-m' must be followed by a module name")
        program = value[0].rsplit("/", 1)[-1]
        if _LAUNCHER.match(program):
            rest = value[1:]
            while rest and rest[0].startswith("--"):  # torchrun's own options: the spec's job
                rest = rest[1:]
            fix = repr(rest) if rest and rest[0] != "-c" else "['train.py', '--lr', '0.1']"
            raise ValueError(
                f"starts with {value[0]!r}, but gpufleet runs every worker with torchrun's own "
                f"Python: write command: {fix} (torchrun's positional form: a script and its "
                "arguments, or ['-m', 'pkg.train'])"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in value if not ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"invalid environment variable name(s): {', '.join(bad)}")
        return value

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        problems: list[Problem] = []
        has_command = data.get("command") is not None
        has_workload = data.get("workload") is not None
        if not has_command and not has_workload:
            problems.append(
                (("command",), "set either spec.command (a script or module) or spec.workload")
            )
        elif has_command and has_workload:
            problems.append((("workload",), "exclusive with spec.command: set one of them"))
        problems += _parallelism_problems(data, has_command)
        nodes = raw_int(data, "nodes", default=1, minimum=1)
        low = raw_int(data, "minNodes", default=0, minimum=1)
        if nodes and low and low > nodes:
            problems.append((("minNodes",), f"is {low}, more than spec.nodes {nodes} (the most "
                             "nodes): an elastic range is minNodes..nodes"))  # fmt: skip
        procs = raw_int(data, "procsPerNode", default=1, minimum=1)
        gpu = raw_int(data, "resources", "gpu", default=0)
        if procs and gpu and procs > gpu:
            problems.append(
                (
                    ("procsPerNode",),
                    f"is {procs} but spec.resources.gpu is {gpu}: with GPUs each process needs "
                    "its own: lower procsPerNode or raise gpu",
                )
            )
        return problems

    @property
    def world_size(self) -> int:
        """Total worker processes."""
        return self.nodes * self.procs_per_node

    @property
    def plain_env(self) -> dict[str, str]:
        """The env entries with a value in the spec."""
        return {k: v for k, v in self.env.items() if isinstance(v, str)}

    @property
    def env_refs(self) -> dict[str, EnvSource]:
        """The env entries that reference a Secret or ConfigMap key."""
        return {k: v for k, v in self.env.items() if isinstance(v, EnvSource)}

    def env_warnings(self) -> list[str]:
        """One line per plain env value that looks like a credential (by its name)."""
        return [
            f"warning: spec.env.{name} looks like a credential in plain text (it would be in "
            f"every rendered pod and in the spec file): write {name}: {{secretKeyRef: {{name: "
            "<secret>, key: <key>}}"
            for name, value in self.plain_env.items()
            if value and CREDENTIAL_NAME.search(name)
        ]

    def cluster_only_fields(self) -> list[str]:
        """Names of set fields the local backend ignores."""
        names = [("image", self.image), ("queue", self.queue), ("priority", self.priority),
                 ("minNodes", self.min_nodes)]  # fmt: skip
        out = [n for n, v in names if v is not None]
        if self.volumes:
            out.append("volumes")
        return out


def _parallelism_problems(data: dict[str, Any], has_command: bool) -> list[Problem]:
    """spec.parallelism applies to the built-in Trainer: refused with a command (the script
    may not use the Trainer, and a setting nothing applies would be silently lost), and the
    accumulation must split the workload's batch evenly."""
    raw = data.get("parallelism")
    if not isinstance(raw, dict) or not raw:
        return []
    # A default value sets nothing, so a command job may carry it (its own dump writes them all).
    defaults = Parallelism().model_dump(by_alias=True)
    if has_command and any(key not in defaults or raw[key] != defaults[key] for key in raw):
        return [(("parallelism",), "applies to built-in workloads (spec.workload), not to a "
                 "command: a script picks its own (gpufleet.runtime.Trainer(..., parallelism="
                 "ParallelismSettings(strategy='fsdp')), or its own fully_shard)")]  # fmt: skip
    accumulation = raw_int(data, "parallelism", "gradientAccumulation", default=1, minimum=1)
    workload = data.get("workload")
    kinds: dict[str, type[_WorkloadBase]] = {
        "digits": DigitsWorkload,
        "synthetic": SyntheticWorkload,
    }
    if accumulation and isinstance(workload, dict) and workload.get("name") in kinds:
        default = kinds[workload["name"]].model_fields["batch_size"].default
        batch = raw_int(data, "workload", "batchSize", default=default, minimum=1)
        if batch and batch % accumulation:
            return [(("parallelism", "gradientAccumulation"), f"is {accumulation}, which does "
                     f"not divide spec.workload.batchSize {batch}: each micro-batch must have "
                     "the same size")]  # fmt: skip
    return []


class TrainingJob(SpecModel):
    """A distributed PyTorch training job (kind TrainingJob)."""

    api_version: Literal["gpufleet.dev/v1alpha1"] = Field(description="Always " + API_VERSION)
    kind: Literal["TrainingJob"] = Field(description="Always TrainingJob.")
    metadata: Metadata = Field(description="Name and labels.")
    spec: TrainingJobSpec = Field(description="What to run and how.")
