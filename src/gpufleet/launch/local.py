"""The local backend: run a TrainingJob on this machine with PyTorch's elastic launcher."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import fsspec

from gpufleet.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    FieldError,
    MetricsPortError,
    UserInputError,
)
from gpufleet.extras import install_hint, missing
from gpufleet.frameworks import FRAMEWORK_BUILDS, FRAMEWORK_PACKAGES
from gpufleet.frameworks.tf.cluster import ENV_TF_INDEX, ENV_TF_WORKERS, local_workers
from gpufleet.launch.fatal import read_fatal
from gpufleet.launch.fresh import set_checkpoints_aside
from gpufleet.launch.lock import job_lock
from gpufleet.launch.logs import last_lines_of_rank
from gpufleet.launch.metrics_server import serve_metrics_dir
from gpufleet.launch.node import NodeConfig, NodeOutcome, launch_node
from gpufleet.launch.pod import metrics_tls
from gpufleet.launch.secrets import check_checkpoint_key, resolve_env
from gpufleet.launch.uploads import DurableCollector, durable_uploads, finish, upload_wait
from gpufleet.launch.worker import (
    DEFAULT_RUN_ROOT,
    local_notes,
    metrics_tls_dir,
    missing_script,
    worker_module_args,
)
from gpufleet.launch.worker import worker_env as shared_worker_env
from gpufleet.net import free_ports
from gpufleet.procs import wait_exit
from gpufleet.runtime.context import DEFAULT_FRAMEWORK, JobContext
from gpufleet.runtime.files import read_json, write_json_atomic
from gpufleet.runtime.rundir import ARCHIVE_DIR, RunDir
from gpufleet.spec import TrainingJob


@dataclass(kw_only=True)
class RunSummary:
    """The outcome of ``gpufleet run``; ``--output json`` prints exactly these fields."""

    name: str
    status: str  # Succeeded | Failed | Preempted | Interrupted
    exit_code: int
    steps: int | None = None
    restarts: int = 0
    launches: int = 1
    final_loss: float | None = None
    accuracy: float | None = None
    checkpoint: str | None = None
    resumed_from: int | None = None
    wall_seconds: float = 0.0
    samples_per_second: float | None = None
    state_digest: str | None = None
    run_dir: str = ""
    message: str | None = None
    # With spec.checkpoint.durable: the newest durable step, whether the last checkpoint got
    # there, the ones that never did, and the last upload error.
    durable: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


def worker_argv(job: TrainingJob) -> list[str]:
    """The worker command on this machine: the job's entry point behind gpufleet's shim."""
    return [sys.executable, "-u", *worker_module_args(job)]


def worker_env(job: TrainingJob, run_dir: Path) -> dict[str, str]:
    """Variables added to torchrun's worker environment on this machine: the pods' (gpufleet.
    launch.worker.worker_env) for the absolute ``run_dir``, and this process's
    OMP_NUM_THREADS when set. References: NodeConfig.secret_env, resolved apart."""
    return shared_worker_env(
        job, run_dir.resolve(), omp_threads=os.environ.get("OMP_NUM_THREADS", "1")
    )


def node_envs(job: TrainingJob, run_dir: Path, ports: list[int]) -> list[dict[str, str]]:
    """Each node's worker environment (worker_env): for a TensorFlow job also every worker's
    address (one of ``ports`` each, its gRPC server) and this node's worker's index in them
    (one worker per node), which win over a TF_CONFIG or completion index around us."""
    env = worker_env(job, run_dir)
    if job.spec.framework != "tensorflow":
        return [env] * job.spec.nodes
    env[ENV_TF_WORKERS] = local_workers(ports[: job.spec.nodes])
    return [{**env, ENV_TF_INDEX: str(i)} for i in range(job.spec.nodes)]


@contextmanager
def serve_metrics(job: TrainingJob, run_dir: Path) -> Iterator[None]:
    """Serve the workers' metrics on 127.0.0.1:spec.metrics.port for the whole run.

    One endpoint for the job, in this process, so it stays up while workers restart. The
    directory starts empty each launch: counters restart with the launch, like a process's.
    """
    port = job.spec.metrics.port
    if not port:
        yield
        return
    tls = metrics_tls(metrics_tls_dir(job))
    try:
        extra = (DurableCollector(RunDir(run_dir).durable, job.metadata.name),)
        durable = extra if job.spec.checkpoint.durable else ()
        with serve_metrics_dir(RunDir(run_dir).metrics, "127.0.0.1", port, durable, tls):
            yield
    except MetricsPortError as exc:
        raise UserInputError([FieldError("spec.metrics.port", str(exc))]) from exc


def prepare_run_dir(run_root: Path, name: str, *, fresh: bool) -> Path:
    """The job's run directory; with ``fresh`` an old one is moved aside (never deleted)."""
    run_dir = run_root / name
    if fresh and run_dir.exists():
        archive = run_root / ARCHIVE_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        archive.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(archive))
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in RunDir(run_dir).stale_files():
        stale.unlink(missing_ok=True)
    return run_dir


def check_script(job: TrainingJob) -> None:
    """A script command names a file here: fail before starting anything when it is missing
    (every worker would fail with FileNotFoundError and the group restart for nothing)."""
    missing = missing_script(job)
    if missing:
        where = "workers run the script from the directory `gpufleet run` runs in"
        raise UserInputError([FieldError("spec.command[0]", f"{missing} ({where})")])


def check_framework(job: TrainingJob) -> None:
    """A framework other than PyTorch must be installed here (its extra), or exit 2 with the
    install command before any worker starts (each would fail on import, and be restarted)."""
    framework = job.spec.framework
    package = FRAMEWORK_PACKAGES.get(framework)  # its extra has its name too
    if package and importlib.util.find_spec(package) is None:
        if framework in FRAMEWORK_BUILDS:
            message = f"{framework} needs {FRAMEWORK_BUILDS[framework]}"
            raise UserInputError([FieldError("spec.framework", message)])
        raise missing(package, package, f"spec.framework {framework}")


def check_checkpoint_storage(job: TrainingJob) -> None:
    """Fail before starting anything when a checkpoint URI's filesystem is not installed."""
    c = job.spec.checkpoint
    for path, uri in (("dir", c.dir), ("durable.dir", c.durable.dir if c.durable else None)):
        if not uri or "://" not in uri:
            continue
        scheme = uri.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(scheme)
        except (ImportError, ValueError) as exc:
            hint = f" ({install_hint('s3')})" if scheme in ("s3", "s3a") else ""
            msg = f"no fsspec filesystem for {scheme}://: {exc}{hint}"
            raise UserInputError([FieldError(f"spec.checkpoint.{path}", msg)]) from None


def run_local(
    job: TrainingJob,
    *,
    run_root: Path = DEFAULT_RUN_ROOT,
    fresh: bool = False,
    echo: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> RunSummary:
    """Run ``job`` to its end on this machine and return its summary (never raises for failure;
    raises JobLockedError at once when another run of the job holds its directories).

    Workers get torchrun's environment; their output is prefixed ``[rankN]:`` on the console and
    kept under ``<run dir>/logs``. Re-running a job resumes from its newest complete checkpoint.
    """
    check_checkpoint_storage(job)
    check_checkpoint_key(job)
    check_script(job)
    check_framework(job)
    secret_env = resolve_env(job)  # the spec's Secret/ConfigMap references, before anything
    with job_lock(run_root, job.metadata.name, job.spec.checkpoint.dir):
        if fresh:
            set_checkpoints_aside(job, echo)
        return _run_locked(job, run_root, fresh, echo, secret_env)


def _run_locked(
    job: TrainingJob,
    run_root: Path,
    fresh: bool,
    echo: Callable[[str], None],
    secret_env: dict[str, str],
) -> RunSummary:
    run_dir = prepare_run_dir(run_root, job.metadata.name, fresh=fresh)
    for note in [*local_notes(job), *job.spec.env_warnings()]:
        echo(note)
    files = RunDir(run_dir)
    state = read_json(files.state) or {"launches": []}
    started = time.time()
    s = job.spec
    run_id = f"{job.metadata.name}-{uuid.uuid4().hex[:8]}"
    # Chosen together (free_ports): the rendezvous and, for TensorFlow, each worker's server.
    ports = free_ports(1 + (s.nodes if s.framework == "tensorflow" else 0))
    endpoint = f"127.0.0.1:{ports[0]}"
    envs = node_envs(job, run_dir, ports[1:])
    configs = [
        NodeConfig(
            run_id=run_id,
            node_rank=i,
            nnodes=s.nodes,
            nproc_per_node=s.procs_per_node,
            rdzv_endpoint=endpoint,
            max_restarts=s.max_restarts,
            shutdown_timeout=s.preemption.grace_period,
            log_dir=str(files.node_logs(i)),
            argv=worker_argv(job),
            env=envs[i],
            secret_env=secret_env,
            fork=s.framework == DEFAULT_FRAMEWORK,
        )
        for i in range(s.nodes)
    ]
    with (
        serve_metrics(job, run_dir),
        durable_uploads(
            JobContext.from_env(envs[0]).checkpoint, job.metadata.name, run_dir, echo
        ) as up,  # fmt: skip
    ):
        if s.framework == "ray":  # a Ray cluster and its driver, not torchrun's agents
            from gpufleet.frameworks.ray.local import run_ray  # it imports this module

            outcomes = [run_ray(job, run_dir, worker_argv(job), envs[0], secret_env)]
        elif s.nodes == 1:
            outcomes = [launch_node(configs[0])]
        else:
            outcomes = _launch_node_processes(configs, files.nodes)
        durable = finish(up, upload_wait(run_dir, s.preemption.grace_period), echo)
    summary = _summarize(job, run_dir, outcomes, started)
    summary.durable = durable
    state["launches"].append(
        {"started": started, "status": summary.status, "restarts": summary.restarts}
    )
    summary.launches = len(state["launches"])
    summary.restarts = sum(int(launch["restarts"]) for launch in state["launches"])
    write_json_atomic(files.state, state)
    return summary


def _summarize(
    job: TrainingJob, run_dir: Path, outcomes: list[NodeOutcome], started: float
) -> RunSummary:
    files = RunDir(run_dir)
    result = read_json(files.result) or {}
    preempted = read_json(files.preempted)
    summary = RunSummary(
        name=job.metadata.name,
        status="Succeeded",
        exit_code=EXIT_OK,
        steps=result.get("steps"),
        restarts=int(result.get("restart_count", 0)),
        final_loss=result.get("final_loss"),
        accuracy=(result.get("metrics") or {}).get("accuracy"),
        checkpoint=result.get("checkpoint"),
        resumed_from=result.get("resumed_from"),
        wall_seconds=round(time.time() - started, 3),
        samples_per_second=result.get("samples_per_second"),
        state_digest=result.get("state_digest"),
        run_dir=str(run_dir),
        extra={k: v for k, v in (result.get("metrics") or {}).items() if k != "accuracy"},
    )
    failed = [(i, o) for i, o in enumerate(outcomes) if o.exit_code == EXIT_FAILED]
    signalled = [o for o in outcomes if o.signal is not None]
    fatal = read_fatal(run_dir)
    if fatal is not None:  # a worker's error no restart could fix: no restart was made
        summary.status, summary.exit_code = "Failed", int(fatal["exit_code"])
        summary.message = f"job {job.metadata.name} failed: {fatal['message']}"
    elif failed:
        node, o = failed[0]
        summary.status, summary.exit_code = "Failed", EXIT_FAILED
        summary.restarts = job.spec.max_restarts
        summary.message = _failure_message(job, files.node_logs(node), o)
    elif signalled and preempted is not None:
        summary.status, summary.exit_code = "Preempted", EXIT_PREEMPTED
        summary.message = (
            f"preempted at step {preempted.get('step')} after checkpoint "
            f"{preempted.get('checkpoint')}; run the same command again to resume"
        )
    elif signalled:
        sig = signalled[0].signal or signal.SIGTERM
        summary.status, summary.exit_code = "Interrupted", 128 + sig
        summary.message = (
            f"stopped by {signal.Signals(sig).name} before a preemption checkpoint was confirmed"
        )
    elif not job.spec.command and not result:  # a user's script may write none; ours always do
        summary.status, summary.exit_code = "Failed", EXIT_FAILED
        summary.message = (
            f"job {job.metadata.name} failed: its workers exited 0 without a result "
            f"({files.result.name}): the built-in workload ended without training"
        )
    return summary


def _failure_message(job: TrainingJob, node_log_dir: Path, o: NodeOutcome) -> str:
    if o.failed_rank is None and o.failed_message:  # a driver's (Ray): its own message
        return o.failed_message
    rank = o.failed_rank
    code = o.failed_exitcode
    what = f"exit code {code}"
    if code is not None and code < 0:
        try:
            what = f"signal {signal.Signals(-code).name}"
        except ValueError:
            what = f"signal {-code}"
    head = (
        f"job {job.metadata.name} failed: rank {rank} ended with {what} "
        f"after {job.spec.max_restarts} restart(s) (spec.maxRestarts)"
    )
    tail = last_lines_of_rank(node_log_dir, o.failed_local_rank or 0)
    if tail:
        head += f"\nlast lines of rank {rank} ({tail[0]}):\n" + "\n".join(
            f"  {ln}" for ln in tail[1]
        )
    return head


@contextmanager
def forward_signals(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # agents treat SIGTERM as "take a checkpoint"

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _launch_node_processes(configs: list[NodeConfig], tmp: Path) -> list[NodeOutcome]:
    """One agent process per local node, like one torchrun per machine on a cluster; their
    configs and outcomes in ``tmp`` (the run directory's, under the run's lock: a launcher
    killed by SIGKILL leaves it there, not in /tmp, and the next launch clears it)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700, parents=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with forward_signals(procs):
            for cfg in configs:
                cfg_file = tmp / f"node{cfg.node_rank}.json"
                # Secret values go by the node process's environment, never into a file.
                cfg_file.write_text(json.dumps(asdict(replace(cfg, secret_env={}))))
                out_file = tmp / f"node{cfg.node_rank}.out.json"
                procs.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "gpufleet.launch.node"),
                            *(str(cfg_file), str(out_file), str(os.getpid())),
                        ],
                        start_new_session=True,  # Ctrl-C reaches us; we forward it once
                        env={**os.environ, **cfg.secret_env},
                        stdout=sys.stdout.fileno(),
                    )
                )
            for p in procs:
                wait_exit(p)  # forward() runs meanwhile, whichever thread got the signal
        outcomes = []
        for cfg, p in zip(configs, procs, strict=True):
            data = read_json(tmp / f"node{cfg.node_rank}.out.json")
            outcomes.append(
                NodeOutcome(**data) if data else NodeOutcome(exit_code=p.returncode or EXIT_FAILED)
            )
        return outcomes
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
