"""What a worker is, wherever it runs: its entry point and the GPUFLEET_* settings it reads.

The local backend and the Kubernetes renderers both build workers from these, so a job behaves
the same on this machine and in a pod.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.frameworks.horovod import HOROVOD_ENV
from gpufleet.frameworks.ray import ENV_RAY_MAX_FAILURES, ENV_RAY_WORKERS, RAY_ENV
from gpufleet.launch.pod import ENV_METRICS_ADDRESS, ENV_METRICS_PORT, ENV_METRICS_TLS_DIR
from gpufleet.launch.secrets import secrets_dir
from gpufleet.runtime.context import ENV_GRACE_PERIOD, JobContext
from gpufleet.runtime.rundir import RunDir
from gpufleet.spec import TrainingJob

DEFAULT_RUN_ROOT = Path(".gpufleet/runs")  # where local runs keep logs, results, checkpoints

SHIM_MODULE = "gpufleet.launch.shim"
WORKLOAD_MODULE = "gpufleet.workloads"
# The built-in workloads' worker of each framework other than PyTorch's (spec.framework): a
# Ray job's is its driver.
FRAMEWORK_MODULES = {"tensorflow": "gpufleet.frameworks.tf", "ray": "gpufleet.frameworks.ray"}


def worker_module_args(job: TrainingJob) -> list[str]:
    """``-m gpufleet.launch.shim <script | -m module> args``: what follows ``python``."""
    module = FRAMEWORK_MODULES.get(job.spec.framework, WORKLOAD_MODULE)
    command = job.spec.command or ["-m", module]
    return ["-m", SHIM_MODULE, *command]


def job_context(
    job: TrainingJob,
    run_dir: Path,
    metrics_dir: str | None = None,
    secrets_root: str | None = None,
) -> JobContext:
    """The runtime settings workers read from GPUFLEET_* variables. The checkpoint directory
    is the spec's, else <run_dir>/checkpoints, named explicitly so every worker agrees; a
    Secret's key file under ``secrets_root`` (None: this machine's, secrets_dir)."""
    s = job.spec
    # A script has no steps gpufleet can see: its watchdog counts from its last output or
    # heartbeat, which a script silent for minutes by design would trip, so only when asked.
    explicit = "hang_timeout" in s.model_fields_set
    return JobContext(
        name=job.metadata.name,
        run_dir=run_dir,
        checkpoint=s.checkpoint.settings(run_dir, secrets_root or secrets_dir()),
        hang_timeout=s.hang_timeout,
        output_hang_timeout=s.hang_timeout if s.command and explicit else 0.0,
        on_non_finite=s.on_non_finite,
        parallelism=s.parallelism.settings(s.nodes * s.procs_per_node),
        workload=s.workload.model_dump(by_alias=True) if s.workload else {},
        metrics_dir=metrics_dir if s.metrics.port else None,
        framework=s.framework,
    )


def worker_env(
    job: TrainingJob,
    run_dir: Path,
    *,
    omp_threads: str = "1",
    metrics_address: str | None = None,
    secrets_root: str | None = None,
) -> dict[str, str]:
    """The variables a worker gets on top of torchrun's, here and in pods alike: torch's
    threads (``OMP_NUM_THREADS``, as torchrun sets it), the GPUFLEET_* context for a job whose
    run directory is ``run_dir`` (metrics under it), and the spec's plain ``env`` last, so it
    wins. ``metrics_address``: in a pod, where the pod launcher serves the job metrics on
    spec.metrics.port (Prometheus scrapes from outside the pod); ``secrets_root``: in a pod,
    where Secrets are mounted (job_context). Secret and ConfigMap references are not here:
    each backend resolves them its own way."""
    context = job_context(job, run_dir, str(RunDir(run_dir).metrics), secrets_root)
    env = {"OMP_NUM_THREADS": omp_threads, **context.to_env()}
    if metrics_address is not None and job.spec.metrics.port:
        env[ENV_METRICS_PORT] = str(job.spec.metrics.port)
        env[ENV_METRICS_ADDRESS] = metrics_address
    if (tls := metrics_tls_dir(job, secrets_root)) is not None:  # the launcher's
        env[ENV_METRICS_TLS_DIR] = tls
    if job.spec.checkpoint.durable:  # the uploader's wait after a preemption counts from it
        env[ENV_GRACE_PERIOD] = f"{job.spec.preemption.grace_period:g}"
    if job.spec.framework == "ray":  # the driver's Ray Train settings, and Ray's own
        s = job.spec
        env |= {ENV_RAY_WORKERS: str(s.nodes * s.procs_per_node),
                ENV_RAY_MAX_FAILURES: str(s.max_restarts), **RAY_ENV}  # fmt: skip
    if job.spec.framework == "horovod":
        env |= HOROVOD_ENV
    return {**env, **job.spec.plain_env}


def metrics_tls_dir(job: TrainingJob, secrets_root: str | None = None) -> str | None:
    """Where spec.metrics.tls's Secret is (tls.crt, tls.key): under ``secrets_root``, a pod's
    mount (None: this machine's, secrets_dir); None without it."""
    tls = job.spec.metrics.tls
    return None if tls is None else f"{secrets_root or secrets_dir()}/{tls.secret_name}"


def missing_script(job: TrainingJob) -> str | None:
    """``<script>: no such file in <cwd>`` when the job's command names a script that is not
    here (None for workloads, ``-m`` modules and scripts that exist)."""
    command = job.spec.command
    if not command or command[0] == "-m" or Path(command[0]).is_file():
        return None
    return f"{command[0]}: no such file in {Path.cwd()}"


def local_notes(job: TrainingJob) -> list[str]:
    """One-line notes about spec fields that do not apply on this machine. Imports torch only
    when the spec asks for GPUs (``gpufleet validate`` stays fast)."""
    notes = []
    ignored = job.spec.cluster_only_fields()
    if job.spec.resources.cpu or job.spec.resources.memory:
        ignored.append("resources.cpu/memory")
    if ignored:
        notes.append(f"note: cluster-only fields ignored locally: {', '.join(ignored)}")
    if job.spec.resources.gpu:
        import torch

        if not torch.cuda.is_available():
            notes.append(
                "note: spec.resources.gpu is set but no CUDA device is here; using gloo on CPU"
            )
    return notes
