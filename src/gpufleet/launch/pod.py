"""``python -m gpufleet.launch.pod [torchrun options] -m gpufleet.launch.shim ...``: a pod's
launcher. It is torchrun (``torch.distributed.run``, called in this process), plus what
``gpufleet run`` does around its agents locally:

- **Job metrics**: when ``GPUFLEET_METRICS_PORT`` is set (the renderers set it from
  ``spec.metrics.port``), it serves every local worker's metrics on that port for the pod's
  whole life, restarts included (address ``GPUFLEET_METRICS_ADDRESS``, default 127.0.0.1;
  the renderers set 0.0.0.0 so Prometheus can reach the pod).
- **Exit codes**: 0 done, 1 failed (after torchrun's restarts, or no rendezvous ever formed),
  a fatal error's own code at once, with no restart (gpufleet.launch.fatal: 2, 4, 5, 6),
  75 retriable: preempted (a SIGTERM, this pod's or another's, and the workers confirmed a
  preemption checkpoint) or the rendezvous host was lost after the group had formed; 128+N
  another signal. Plain torchrun exits 1 for all of these (a lost host with a traceback), and
  the Job's podFailurePolicy could not tell a preemption or the loss of pod 0 from a crash.
- **Kept logs**: each rank's output goes to the pod's log (torchrun's ``--tee``; each line
  prefixed ``[default<local rank>]:``) and to files in the run directory (``--log-dir``, as
  ``gpufleet run`` does), copied beside the checkpoints when the launcher exits
  (gpufleet.launch.keptlogs), for ``gpufleet logs`` once the pods are gone. A ``--log-dir``
  given on the command line is kept as given, and nothing is copied from it.

A lost rendezvous host: pod 0 hosts the c10d store. When it goes (node failure, eviction,
preemption: the Job controller does not count it, it carries a DisruptionTarget condition),
every other pod's agent loses the store and cannot rendezvous again; its replacement pod 0
hosts a new store under the same name. Those pods exit 75, which the pod failure policy does
not count either, and their replacements join the new pod 0 and resume from the last
checkpoint: one lost pod costs no restart of ``spec.maxRestarts``. Only a loss *after* a
rendezvous formed is retriable; a host that was never reachable (a wrong name, a network
policy) exits 1, so a pod cannot retry forever without counting. With ``maxRestarts: 0``
torchrun may report the lost host as a worker failure first (it has no restart in which to
notice the store is gone), and that exits 1.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from ssl import SSLContext
from typing import Any

from gpufleet.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    CheckpointKeyError,
    UserInputError,
)
from gpufleet.launch.fatal import no_restart_after_fatal, read_fatal
from gpufleet.launch.keptlogs import keep, kept_name
from gpufleet.launch.uploads import DurableCollector, durable_uploads, finish, upload_wait
from gpufleet.runtime.context import (
    DEFAULT_FRAMEWORK,
    ENV_CHECKPOINT_DURABLE,
    ENV_GRACE_PERIOD,
    ENV_JOB_NAME,
    ENV_METRICS_DIR,
    ENV_RUN_DIR,
    JobContext,
    env_framework,
    kept_logs_root,
)
from gpufleet.runtime.rundir import RunDir

# torch's switch that stops the agents sharing their rendezvous TCPStore with the workers.
ENV_NO_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
ENV_METRICS_PORT = "GPUFLEET_METRICS_PORT"
ENV_METRICS_ADDRESS = "GPUFLEET_METRICS_ADDRESS"
# spec.metrics.tls: the directory of the mounted kubernetes.io/tls Secret (tls.crt, tls.key)
ENV_METRICS_TLS_DIR = "GPUFLEET_METRICS_TLS_DIR"
MODULE = "gpufleet.launch.pod"


def _metrics(env: dict[str, str]) -> AbstractContextManager[Any]:
    port = int(env.get(ENV_METRICS_PORT) or 0)
    directory = env.get(ENV_METRICS_DIR)
    if not port or not directory:
        return nullcontext()
    from gpufleet.launch.metrics_server import serve_metrics_dir

    extra: tuple[Any, ...] = ()
    if env.get(ENV_CHECKPOINT_DURABLE):  # the node's uploader's series (its state file)
        state = RunDir(Path(env.get(ENV_RUN_DIR, "."))).durable
        extra = (DurableCollector(state, env.get(ENV_JOB_NAME, "job")),)
    address = env.get(ENV_METRICS_ADDRESS, "127.0.0.1")
    tls = metrics_tls(env.get(ENV_METRICS_TLS_DIR))
    return serve_metrics_dir(Path(directory), address, port, extra, tls)


def metrics_tls(directory: str | None) -> SSLContext | None:
    """The job metrics' TLS context from a mounted kubernetes.io/tls Secret's directory (None:
    plain HTTP); UserInputError naming spec.metrics.tls when its files cannot serve."""
    if not directory:
        return None
    from gpufleet.observe.tls import TlsFiles, checked_context

    field = "spec.metrics.tls.secretName"
    return checked_context(TlsFiles.in_dir(directory), (field, field, field))


def rendezvous_conf(conf: str, endpoint: str, hostname: str) -> str:
    """torchrun's ``--rdzv-conf`` with ``is_host`` set explicitly: true on the pod the endpoint
    names (its first DNS label is the pod's hostname: ``<job>-0`` of ``<job>-0.<job>:29400``),
    false elsewhere. Left unset, the c10d backend decides by resolving the endpoint at start-up,
    and the headless Service's record of a pod that just started may not exist yet: rank 0
    then waits as a client for a store nobody hosts. An explicit ``is_host`` is kept.

    Elsewhere the store's ``read_timeout`` (how long the agent tries to reach pod 0's store)
    becomes the rendezvous' own ``join_timeout`` (torch's default: 600 s) unless given: a pod
    that replaces one while pod 0 is itself being replaced (its node lost: the node
    controller's grace period, spec.nodeLossTimeout, a new pod's start) waits for it as long
    as the rendezvous waits for its members. torch's 60 s failed such a pod, counted (exit 1),
    where the node loss should cost no restart; a host never reachable still exits 1."""
    items = [c for c in conf.split(",") if c]
    keys = {c.split("=", 1)[0].strip(): c.split("=", 1)[-1].strip() for c in items}
    if "is_host" in keys:
        return conf
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
        return conf  # an address (a run on one machine): torch compares it without DNS
    except ValueError:
        pass
    if host == "localhost":
        return conf
    if host.split(".", 1)[0] == hostname:
        return ",".join([*items, "is_host=true"])
    if "read_timeout" not in keys:
        items.append(f"read_timeout={keys.get('join_timeout') or _join_timeout_s()}")
    return ",".join([*items, "is_host=false"])


def _join_timeout_s() -> int:
    """torch's default ``join_timeout`` for the c10d rendezvous, in seconds."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    return int(RendezvousTimeout().join.total_seconds())


class _RendezvousWatch:
    """Whether this pod's agent ever completed a rendezvous. torchelastic publishes it itself:
    its ``@prof`` decorator emits ``<qualname>.success`` to the "torchelastic" metrics group
    when ``SimpleElasticAgent._rendezvous`` returns; we listen on that public hook."""

    METRIC = "SimpleElasticAgent._rendezvous.success"

    def __init__(self) -> None:
        from torch.distributed.elastic.metrics.api import MetricHandler, configure

        watch = self

        class Handler(MetricHandler):
            def emit(self, metric_data: Any) -> None:
                if metric_data.name == _RendezvousWatch.METRIC:
                    watch.formed = True

        self.formed = False
        configure(Handler(), "torchelastic")


def _host_watch(
    args: Any, watch: _RendezvousWatch, keep_logs: Callable[[], None]
) -> AbstractContextManager[Any]:
    """The rendezvous host watched from every pod but the host's own (hostwatch.py)."""
    if args.rdzv_backend != "c10d" or not args.rdzv_endpoint or "is_host=true" in args.rdzv_conf:
        return nullcontext()
    from gpufleet.launch.hostwatch import HostWatch

    lost = _lost_host(args.rdzv_endpoint, keep_logs)
    return HostWatch(args.rdzv_endpoint, lambda: watch.formed, lost)


def _cause(exc: BaseException) -> str:
    """The innermost reason of a rendezvous error, on one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return " ".join(str(exc).split()) or type(exc).__name__


ALL_STREAMS = "3"  # torchrun's --tee value for stdout and stderr


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; return gpufleet's exit code for the outcome. The ranks' logs
    are kept beside the checkpoints whatever the outcome (a launcher killed at once keeps none)."""
    from torch.distributed.run import parse_args

    started = time.time()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    run_dir = Path(os.environ.get(ENV_RUN_DIR, "."))
    ours = not args.log_dir
    if ours:
        args.log_dir = str(RunDir(run_dir).logs)
        args.tee = ALL_STREAMS if args.tee == "0" else args.tee  # tee also writes the files
    for stream in (sys.stdout, sys.stderr):  # torchelastic's tail of the ranks' files
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    keep_logs = _keeper(args.log_dir if ours else None, started)
    try:
        return _launch(args, run_dir, keep_logs)
    except (CheckpointKeyError, UserInputError) as exc:  # a key, a certificate: no restart
        _say(f"gpufleet: {exc}")  # brings them
        return exc.exit_code
    finally:
        keep_logs()


def _keeper(log_dir: str | None, started: float) -> Callable[[], None]:
    """What keeps the ranks' logs beside the checkpoints (the durable tier's, with one: once;
    nothing for a ``--log-dir`` given on the command line, or with no checkpoint directory)."""
    done = threading.Lock()

    def keep_logs() -> None:
        checkpoints = kept_logs_root(os.environ)
        if log_dir is None or not checkpoints or not done.acquire(blocking=False):
            return
        import signal
        import socket

        # torchrun's SIGTERM handler raises: one arriving now would turn the job's exit code
        # into a traceback; the kubelet's SIGKILL after the grace period still ends us (only
        # the main thread sets handlers; the host watch's thread exits on its own)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        keep(Path(log_dir), checkpoints, kept_name(started, socket.gethostname()))

    return keep_logs


def _lost_host(where: str, keep_logs: Callable[[], None]) -> Callable[[str], None]:
    """What the host watch does when the rendezvous host went silent (its node lost): the
    agent is blocked on the store, so this thread ends the workers, keeps the logs, exits 75."""

    def lost(reason: str) -> None:
        import psutil

        print(f"gpufleet: lost the rendezvous host {where} after the group formed ({reason}); "
              f"exit {EXIT_PREEMPTED}: retry, the job resumes from its last checkpoint",
              file=sys.stderr, flush=True)  # fmt: skip
        try:
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            keep_logs()
        finally:
            os._exit(EXIT_PREEMPTED)

    return lost


def _prepared(args: Any) -> Callable[[], None]:
    """torchrun's ``run(args)`` for the c10d rendezvous the renderers give, the shim's workers
    forked from a forkserver (gpufleet.launch.forked) instead of each a new Python; prepared
    before the launcher starts its threads (metrics, host watch, uploads), so that the
    forkserver can be a fork of it (gpufleet.launch.zygote)."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args

    from gpufleet.launch.forked import entrypoint, start, stop

    if args.standalone or args.rdzv_backend != "c10d":
        from torch.distributed.run import run

        return lambda: run(args)  # what we do not render: torchrun's own, workers as commands
    config, cmd, cmd_args = config_from_args(args)
    fork = env_framework() == DEFAULT_FRAMEWORK  # another framework's workers: started anew
    entry, entry_args, start_method = entrypoint([str(cmd), *cmd_args], fork=fork)
    if start_method:
        config.start_method = start_method
    start(start_method)

    def launch() -> None:
        try:
            elastic_launch(config=config, entrypoint=entry)(*entry_args)
        finally:
            stop(start_method)

    return launch


def _launch(args: Any, run_dir: Path, keep_logs: Callable[[], None]) -> int:
    """torchrun's ``run(args)``, its outcome mapped to gpufleet's exit codes, and then the wait
    for the last checkpoint's durable upload (a job with spec.checkpoint.durable)."""
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        import socket

        args.rdzv_conf = rendezvous_conf(args.rdzv_conf, args.rdzv_endpoint, socket.gethostname())
    # A pod that replaces a failed one starts a new agent, which joins a later rendezvous
    # round. With the shared store, torch builds the workers' MASTER_ADDR/PORT once per agent
    # (dynamic_rendezvous.next_rendezvous): the long-lived rank-0 agent never writes them for
    # that round, and the new agent's get of <round>/MASTER_ADDR times out (DistStoreError),
    # failing the job that should resume. Unshared, rank 0 writes them every round and the
    # workers' store is hosted by worker rank 0, new in each round.
    os.environ.setdefault(ENV_NO_SHARED_STORE, "1")
    files = RunDir(run_dir)
    for stale in (files.preempted, files.fatal, files.durable):  # this pod's last try's
        stale.unlink(missing_ok=True)
    watch = _RendezvousWatch()
    context = JobContext.from_env()
    grace = float(os.environ.get(ENV_GRACE_PERIOD) or 0)
    launch = _prepared(args)
    with (
        _metrics(dict(os.environ)),
        no_restart_after_fatal(run_dir, preempted=True),
        _host_watch(args, watch, keep_logs),
        durable_uploads(context.checkpoint, context.name, run_dir) as uploader,
    ):
        code = _outcome(launch, args, run_dir, watch)
        finish(uploader, upload_wait(run_dir, grace), _say)
    return code


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _outcome(launch: Callable[[], None], args: Any, run_dir: Path, watch: _RendezvousWatch) -> int:
    """torchrun's run (``launch``), its outcome as gpufleet's exit code."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    try:
        launch()
    except RendezvousError as exc:
        where = args.rdzv_endpoint or "the rendezvous"
        if watch.formed:
            print(f"gpufleet: lost the rendezvous host {where} after the group formed "
                  f"({_cause(exc)}); exit {EXIT_PREEMPTED}: retry, the job resumes from its "
                  "last checkpoint", file=sys.stderr, flush=True)  # fmt: skip
            return EXIT_PREEMPTED
        print(f"gpufleet: no rendezvous at {where}: {_cause(exc)}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except ChildFailedError as exc:
        fatal = read_fatal(run_dir)
        if fatal is not None:  # said once by the worker; no restart was made
            return int(fatal["exit_code"])
        if _preempted(run_dir):  # another pod's SIGTERM stopped the group: no restart was made
            return EXIT_PREEMPTED
        print(f"gpufleet: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except SignalException as exc:
        return EXIT_PREEMPTED if _preempted(run_dir) else 128 + int(exc.sigval)
    return EXIT_OK


def _preempted(run_dir: Path) -> bool:
    """Whether the workers stopped after a preemption checkpoint; said once, here."""
    if not RunDir(run_dir).preempted.exists():
        return False
    print("gpufleet: preempted after a checkpoint", file=sys.stderr, flush=True)
    return True


if __name__ == "__main__":
    sys.exit(main())
