"""Kind ``TrainingJob``: what to run, how wide, how it checkpoints and survives failures."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from gpufleet.runtime.context import (
    DEFAULT_FRAMEWORK,
    MAX_ROLLBACKS,
    PARALLELISM_DEFAULTS,
    ParallelismSettings,
)
from gpufleet.spec.checkpoint import Checkpoint as Checkpoint
from gpufleet.spec.env import CREDENTIAL_NAME, ENV_NAME, EnvFromSource, EnvSource, EnvValue
from gpufleet.spec.names import API_VERSION, DnsLabel, Metadata, ObjectRefName
from gpufleet.spec.resources import Rdma, Resources, Topology, Volume
from gpufleet.spec.training_rules import (
    FRAMEWORK_HELP,
    Framework,
    exact_problems,
    framework_problems,
    parallelism_problems,
)
from gpufleet.spec.validation import (
    INT32_MAX,
    MAX_BATCH,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    CrossFieldModel,
    Duration,
    Problem,
    SpecModel,
    raw_int,
)
from gpufleet.spec.workloads import WORKLOAD_KINDS, Workload

# A training job cannot step without every rank: waiting Kubernetes' 300 s for a lost node to
# come back only delays the restart. Long enough to ride out a kubelet restart.
NODE_LOSS_TIMEOUT = 30.0


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

    exact_across_world_sizes: bool = Field(
        default=False,
        description=(
            "Bit-exact at any world size: every world size that divides spec.parallelism.shards "
            "trains to the same weights, bit for bit, also across a resize (each shard's "
            "gradient on its own, summed in one fixed order; dropout seeded by step and shard). "
            "Needs strategy ddp; costs a gather instead of an all-reduce (docs/parallelism.md)."
        ),
    )
    shards: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BATCH,
        description=(
            "With exactAcrossWorldSizes: the virtual shards of each step's global batch, a "
            "power of two; default the largest world size, spec.nodes x spec.procsPerNode."
        ),
    )

    def settings(self, largest_world: int) -> ParallelismSettings:
        """These fields as the runtime's settings, for a job of at most ``largest_world``
        workers (the default number of shards)."""
        exact = (self.shards or largest_world) if self.exact_across_world_sizes else 0
        return ParallelismSettings(
            strategy=self.strategy,
            mixed_precision=self.mixed_precision,
            activation_checkpointing=self.activation_checkpointing,
            gradient_accumulation=self.gradient_accumulation,
            exact_shards=exact,
        )


class MetricsTls(SpecModel):
    """HTTPS on the job's metrics port (gpufleet.observe.tls)."""

    secret_name: ObjectRefName = Field(
        description=(
            "A Secret of type kubernetes.io/tls (tls.crt, tls.key; ca.crt, the CA that signed "
            "them, as cert-manager writes it, is what the PodMonitor trusts), mounted read-only "
            "into the worker pods. `gpufleet run` reads .gpufleet/secrets/<name>/."
        ),
    )
    server_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description=(
            "The name Prometheus checks the certificate for (the PodMonitor's "
            "tlsConfig.serverName); unset: the pod's address, which the certificate must name."
        ),
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

    tls: MetricsTls | None = Field(
        default=None,
        description="Serve the metrics over HTTPS only; the PodMonitor scrapes with TLS.",
    )

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        for field in ("podMonitor", "tls"):
            if data.get(field) not in (None, False) and not data.get("port"):
                return [((field,), "needs a port to serve on: set spec.metrics.port")]
        return []


class Preemption(SpecModel):
    """How a SIGTERM (node drain, Kueue preemption, Ctrl-C) is handled."""

    grace_period: Duration = Field(
        default=30.0,
        description="Seconds the workers get to take the preemption checkpoint before SIGKILL "
        "(with torch 2.12 or later; an older torchrun gives them 30 s).",
    )


# Programs that are not a training script: an interpreter or a launcher in command[0] would be
# run *by* torchrun's Python as if it were the script (FileNotFoundError '.../python').
_LAUNCHER = re.compile(r"^(python|pypy|ipython)[0-9.]*$|^(torchrun|bash|sh|env|uv|conda)$")


class TrainingJobSpec(CrossFieldModel):
    """What to run, how wide, and how it survives failures."""

    framework: Framework = Field(default=DEFAULT_FRAMEWORK, description=FRAMEWORK_HELP)
    command: list[str] | None = Field(
        default=None,
        description=(
            "A user's script or module with its arguments, exactly torchrun's positional form: "
            "['train.py', '--lr', '0.1'] or ['-m', 'pkg.train']. Exclusive with workload."
        ),
    )
    workload: Workload | None = Field(
        default=None,
        description=f"A built-in workload instead of a command ({', '.join(WORKLOAD_KINDS)}).",
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
            "jobset and pytorchjob (elasticPolicy); `gpufleet run` starts spec.nodes agents. "
            "With spec.queue (target job): one of Kueue's elastic jobs, grown into free quota "
            "and readmitted at the size that fits by the chart's elastic controller."
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
    node_loss_timeout: Duration = Field(
        default=NODE_LOSS_TIMEOUT,
        description=(
            "Cluster only: seconds a pod stays bound to a node that is NotReady or unreachable "
            "before Kubernetes evicts it and the job restarts without it (the pods' "
            "tolerationSeconds; Kubernetes' default is 300). The node is marked so only "
            "after the controller manager's --node-monitor-grace-period (40-50 s by default)."
        ),
    )
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
    topology: Topology | None = Field(
        default=None,
        description="Cluster only: the topology domain Kueue places the workers in (spec.queue).",
    )
    rdma: Rdma | None = Field(
        default=None, description="Cluster only: the InfiniBand network of the workers' NCCL."
    )

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
        problems += parallelism_problems(data, has_command)
        problems += exact_problems(data)
        problems += framework_problems(data)
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
        fields = (("volumes", self.volumes), ("topology", self.topology), ("rdma", self.rdma))
        out += [n for n, v in fields if v]
        return out


class TrainingJob(SpecModel):
    """A distributed training job (kind TrainingJob): PyTorch, TensorFlow, Ray (spec.framework)."""

    api_version: Literal["gpufleet.dev/v1alpha1"] = Field(description="Always " + API_VERSION)
    kind: Literal["TrainingJob"] = Field(description="Always TrainingJob.")
    metadata: Metadata = Field(description="Name and labels.")
    spec: TrainingJobSpec = Field(description="What to run and how.")
