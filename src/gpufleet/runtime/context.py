"""What the launcher tells a worker, read from the environment.

The worker environment is exactly torchrun's (RANK, WORLD_SIZE, ...) plus these ``GPUFLEET_*``
variables, set the same way locally and in pods. A plain torchrun script ignores them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

# The run directory's file names live in gpufleet.runtime.rundir; these two are re-exported.
from gpufleet.runtime.rundir import CHECKPOINTS_DIR as CHECKPOINTS_DIR
from gpufleet.runtime.rundir import PREEMPTED_FILE as PREEMPTED_FILE
from gpufleet.runtime.rundir import RunDir

ENV_RUN_DIR = "GPUFLEET_RUN_DIR"
ENV_JOB_NAME = "GPUFLEET_JOB_NAME"
ENV_CHECKPOINT_DIR = "GPUFLEET_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = "GPUFLEET_CHECKPOINT_EVERY"
ENV_CHECKPOINT_KEEP = "GPUFLEET_CHECKPOINT_KEEP"
ENV_CHECKPOINT_ASYNC = "GPUFLEET_CHECKPOINT_ASYNC"
# spec.checkpoint.durable: the durable tier the node's uploader fills, read on resume
ENV_CHECKPOINT_DURABLE = "GPUFLEET_CHECKPOINT_DURABLE"
ENV_CHECKPOINT_DURABLE_KEEP = "GPUFLEET_CHECKPOINT_DURABLE_KEEP"
# spec.checkpoint.durable.encryption: the path of the file holding the durable tier's key (a
# mounted Secret's in a pod); the key itself is never in the environment
ENV_CHECKPOINT_KEY_FILE = "GPUFLEET_CHECKPOINT_KEY_FILE"
# spec.preemption.gracePeriod in seconds, for a pod launcher's wait for the durable upload
ENV_GRACE_PERIOD = "GPUFLEET_GRACE_PERIOD"
# Whose disk a node's fast checkpoint tier is: the host name (a pod's name) unless set. Two
# processes with the same one share their fast tier's files (gpufleet.runtime.durable).
ENV_NODE_ID = "GPUFLEET_NODE_ID"
ENV_HANG_TIMEOUT = "GPUFLEET_HANG_TIMEOUT"
# Set for command jobs with an explicit hangTimeout: the worker shim's watchdog then counts
# from the worker's last output or gpufleet.runtime.heartbeat() (gpufleet.runtime.watchdog).
ENV_OUTPUT_HANG_TIMEOUT = "GPUFLEET_OUTPUT_HANG_TIMEOUT"
ENV_WORKLOAD = "GPUFLEET_WORKLOAD"
# spec.framework when not pytorch (the worker shim then imports no torch: gpufleet.frameworks).
ENV_FRAMEWORK = "GPUFLEET_FRAMEWORK"
DEFAULT_FRAMEWORK: Final = "pytorch"  # spec.framework's default: workers torchrun forks
# spec.parallelism as JSON (ParallelismSettings): the Trainer's strategy, precision and so on.
ENV_PARALLELISM = "GPUFLEET_PARALLELISM"
# A directory: when set, every Trainer rank appends the sample ids of each step to
# <dir>/rank<R>-of-<W>-restart<N>.jsonl (the proof that a resume skips and repeats nothing).
ENV_SAMPLE_LOG = "GPUFLEET_SAMPLE_LOG"
# spec.onNonFinite: "fail" (the default, unset) or "rollback" (gpufleet.runtime.trainer).
ENV_ON_NON_FINITE = "GPUFLEET_ON_NON_FINITE"
# How often one run may roll back over a non-finite loss before it fails after all: a NaN
# that a skipped batch does not cure (a too-large learning rate) must still end the job.
MAX_ROLLBACKS = 3
# prometheus_client's multiprocess mode: each worker writes its metrics into files there, and
# one server (the launcher, locally) serves the sum of all of them.
ENV_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
# Where what is derived once per machine is kept (the built-in digits data as arrays, so that a
# worker need not import scikit-learn); unset: $XDG_CACHE_HOME/gpufleet, else ~/.cache/gpufleet.
ENV_CACHE_DIR = "GPUFLEET_CACHE_DIR"


def env_framework() -> str:
    """This worker's spec.framework, from its environment (ENV_FRAMEWORK; unset: PyTorch)."""
    return os.environ.get(ENV_FRAMEWORK, DEFAULT_FRAMEWORK)


def kept_logs_root(env: Mapping[str, str]) -> str | None:
    """Where a pod's launcher keeps its ranks' logs, in a worker environment ``env``: beside
    the checkpoints that outlive the pod, the durable tier's when the job has one (its fast tier
    may be the pod's own disk), else the checkpoint directory."""
    return env.get(ENV_CHECKPOINT_DURABLE) or env.get(ENV_CHECKPOINT_DIR) or None


def node_id() -> str:
    """This process's node, as checkpoint markers and the uploader name it (ENV_NODE_ID)."""
    import socket

    return os.environ.get(ENV_NODE_ID) or socket.gethostname()


def node_dir_name(node: str) -> str:
    """A node's id as a file or directory name (the uploader's part records, opened copies)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", node)


def restart_count() -> int:
    """How many times the launcher (torchrun's elastic agent) restarted this worker group."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def cache_dir() -> Path:
    """gpufleet's cache directory (ENV_CACHE_DIR); it may not exist, or not be writable."""
    if where := os.environ.get(ENV_CACHE_DIR):
        return Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpufleet"


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    """How a job checkpoints. The one home of these defaults: the spec's ``checkpoint`` fields,
    the worker environment, the Trainer and the Checkpointer all take them from here."""

    dir: str | None = None  # a directory or fsspec URI; None: <run dir>/checkpoints
    every_steps: int = 50
    keep: int = 3  # complete checkpoints kept, newest first
    async_save: bool = False
    # The durable tier (a directory or fsspec URI), filled in the background from the fast
    # tier above by each node's uploader (gpufleet.runtime.durable); None: one tier.
    durable: str | None = None
    durable_keep: int = 5  # complete checkpoints kept on the durable tier, newest first
    # The file holding the key the durable tier's copies are encrypted with; None: plaintext.
    key_file: str | None = None

    def root(self, run_dir: Path) -> str:
        """The checkpoint directory (or URI) of a job whose run directory is ``run_dir``."""
        return self.dir or str(RunDir(run_dir).checkpoints)


CHECKPOINT_DEFAULTS = CheckpointSettings()

STRATEGIES = ("ddp", "fsdp")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True)
class ParallelismSettings:
    """How the Trainer spreads a model over its workers (gpufleet.runtime.parallel applies it).
    The one home of these defaults: the spec's ``parallelism`` fields and the Trainer read them
    from here."""

    strategy: str = "ddp"  # ddp: a full replica per worker; fsdp: FSDP2, sharded per block
    mixed_precision: str = "fp32"  # bf16: bf16 compute (and FSDP params), fp32 reduction
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    gradient_accumulation: int = 1  # micro-batches per step and worker (splits the batch)
    # Bit-exact at every world size dividing it: the virtual shards per step (a power of two),
    # each reduced in a fixed order (gpufleet.runtime.exact); 0: off.
    exact_shards: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got "
                             f"{self.strategy!r}")  # fmt: skip
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {', '.join(PRECISIONS)}, got "
                             f"{self.mixed_precision!r}")  # fmt: skip
        if self.gradient_accumulation < 1:
            raise ValueError(f"gradient_accumulation must be >= 1, got "
                             f"{self.gradient_accumulation}")  # fmt: skip
        if self.exact_shards:
            self._check_exact()

    def _check_exact(self) -> None:
        if self.exact_shards < 0 or self.exact_shards & (self.exact_shards - 1):
            raise ValueError(f"exact_shards must be a power of two, got {self.exact_shards}")
        if self.strategy != "ddp" or self.gradient_accumulation != 1:
            raise ValueError("exact_shards needs strategy ddp and no gradient_accumulation: "
                             "each shard is a micro-batch")  # fmt: skip

    def to_json(self) -> dict[str, object]:
        """The settings as JSON-able data (the worker environment carries it)."""
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ParallelismSettings:
        """Settings from ``to_json``'s output."""
        return cls(**data)  # type: ignore[arg-type]  # validated in __post_init__


PARALLELISM_DEFAULTS = ParallelismSettings()


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """Settings a worker runs with. Defaults serve a script started by plain torchrun."""

    name: str = "job"
    run_dir: Path = field(default_factory=lambda: Path(".gpufleet/runs/job"))
    checkpoint: CheckpointSettings = CHECKPOINT_DEFAULTS
    hang_timeout: float = 0.0
    output_hang_timeout: float = 0.0
    on_non_finite: str = "fail"
    workload: dict[str, object] = field(default_factory=dict)
    metrics_dir: str | None = None
    parallelism: ParallelismSettings = PARALLELISM_DEFAULTS
    sample_log: Path | None = None
    framework: str = DEFAULT_FRAMEWORK

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> JobContext:
        """Read the context from ``env`` (default: ``os.environ``)."""
        e = dict(os.environ if env is None else env)
        name = e.get(ENV_JOB_NAME, "job")
        run_dir = Path(e.get(ENV_RUN_DIR, f".gpufleet/runs/{name}"))
        d = CHECKPOINT_DEFAULTS
        checkpoint = CheckpointSettings(
            dir=e.get(ENV_CHECKPOINT_DIR) or None,
            every_steps=int(e.get(ENV_CHECKPOINT_EVERY, d.every_steps)),
            keep=int(e.get(ENV_CHECKPOINT_KEEP, d.keep)),
            async_save=e.get(ENV_CHECKPOINT_ASYNC, "1" if d.async_save else "0") == "1",
            durable=e.get(ENV_CHECKPOINT_DURABLE) or None,
            durable_keep=int(e.get(ENV_CHECKPOINT_DURABLE_KEEP, d.durable_keep)),
            key_file=e.get(ENV_CHECKPOINT_KEY_FILE) or None,
        )
        return cls(
            name=name,
            run_dir=run_dir,
            checkpoint=checkpoint,
            hang_timeout=float(e.get(ENV_HANG_TIMEOUT, "0")),
            output_hang_timeout=float(e.get(ENV_OUTPUT_HANG_TIMEOUT, "0")),
            on_non_finite=e.get(ENV_ON_NON_FINITE, "fail"),
            workload=json.loads(e.get(ENV_WORKLOAD, "{}")),
            metrics_dir=e.get(ENV_METRICS_DIR) or None,
            parallelism=ParallelismSettings.from_json(json.loads(e.get(ENV_PARALLELISM, "{}"))),
            sample_log=Path(e[ENV_SAMPLE_LOG]) if e.get(ENV_SAMPLE_LOG) else None,
            framework=e.get(ENV_FRAMEWORK, DEFAULT_FRAMEWORK),
        )

    @property
    def checkpoint_root(self) -> str:
        """Where this job's checkpoints are: the spec's directory or <run dir>/checkpoints."""
        return self.checkpoint.root(self.run_dir)

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce this context in a worker."""
        env = {
            ENV_JOB_NAME: self.name,
            ENV_RUN_DIR: str(self.run_dir),
            ENV_CHECKPOINT_EVERY: str(self.checkpoint.every_steps),
            ENV_CHECKPOINT_KEEP: str(self.checkpoint.keep),
            ENV_CHECKPOINT_ASYNC: "1" if self.checkpoint.async_save else "0",
            ENV_HANG_TIMEOUT: str(self.hang_timeout),
        }
        if self.output_hang_timeout > 0:
            env[ENV_OUTPUT_HANG_TIMEOUT] = str(self.output_hang_timeout)
        if self.on_non_finite != "fail":
            env[ENV_ON_NON_FINITE] = self.on_non_finite
        if self.checkpoint.dir:
            env[ENV_CHECKPOINT_DIR] = self.checkpoint.dir
        if self.checkpoint.durable:
            env[ENV_CHECKPOINT_DURABLE] = self.checkpoint.durable
            env[ENV_CHECKPOINT_DURABLE_KEEP] = str(self.checkpoint.durable_keep)
        if self.checkpoint.key_file:
            env[ENV_CHECKPOINT_KEY_FILE] = self.checkpoint.key_file
        if self.workload:
            env[ENV_WORKLOAD] = json.dumps(self.workload, sort_keys=True)
        if self.metrics_dir:
            env[ENV_METRICS_DIR] = self.metrics_dir
        if self.parallelism != PARALLELISM_DEFAULTS:  # a job without it renders as before
            env[ENV_PARALLELISM] = json.dumps(self.parallelism.to_json(), sort_keys=True)
        if self.sample_log is not None:
            env[ENV_SAMPLE_LOG] = str(self.sample_log)
        if self.framework != DEFAULT_FRAMEWORK:
            env[ENV_FRAMEWORK] = self.framework
        return env
