"""One node's elastic agent: PyTorch's own launcher (torch.distributed.launcher.api).

``launch_node`` is what ``torchrun`` does for one node, called as a function so gpufleet can
read the outcome (which rank failed, with what code) instead of parsing a process's stderr.
For jobs of several local nodes each agent runs in its own process:
``python -m gpufleet.launch.node CONFIG_JSON OUTCOME_JSON LAUNCHER_PID``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet import torchapi
from gpufleet.errors import EXIT_FAILED, EXIT_OK
from gpufleet.launch.fatal import no_restart_after_fatal
from gpufleet.launch.forked import entrypoint
from gpufleet.launch.forked import start as start_forkserver
from gpufleet.launch.forked import stop as stop_forkserver
from gpufleet.launch.orphans import ENV_AGENT_PID, die_with_parent
from gpufleet.runtime.context import ENV_RUN_DIR


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """Everything one node's agent needs; JSON-able so it can cross a process boundary."""

    run_id: str
    node_rank: int
    nnodes: int
    nproc_per_node: int
    rdzv_endpoint: str
    max_restarts: int
    shutdown_timeout: float
    log_dir: str
    argv: list[str]
    env: dict[str, str]
    # Values of the spec's Secret/ConfigMap references: set in the workers' environment like
    # env, but never written into the JSON that crosses to a node process (its environment
    # carries them: see gpufleet.launch.local).
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    # Workers forked from a forkserver that imported torch (PyTorch jobs), else started anew.
    fork: bool = True


@dataclass(frozen=True, kw_only=True)
class NodeOutcome:
    """How one node's agent ended."""

    exit_code: int
    signal: int | None = None
    failed_rank: int | None = None
    failed_local_rank: int | None = None
    failed_exitcode: int | None = None
    failed_message: str | None = None


def launch_node(cfg: NodeConfig) -> NodeOutcome:
    """Run one node's worker group to completion under torch's elastic agent."""
    # torch here, not at the module's top: `gpufleet run` of several nodes imports this module
    # for NodeConfig only, and its agents run in processes of their own (2.4 CPU-s per run).
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.update(cfg.env)
    os.environ.update(cfg.secret_env)
    os.environ[ENV_AGENT_PID] = str(os.getpid())  # lets the workers spot an early death
    entry, args, start_method = entrypoint(cfg.argv, fork=cfg.fork)
    config = LaunchConfig(
        min_nodes=cfg.nnodes,
        max_nodes=cfg.nnodes,
        nproc_per_node=cfg.nproc_per_node,
        run_id=cfg.run_id,
        role="worker",
        rdzv_backend="c10d",
        rdzv_endpoint=cfg.rdzv_endpoint,
        # Every local agent resolves 127.0.0.1 as its own address; name one store host.
        rdzv_configs={"is_host": cfg.node_rank == 0},
        max_restarts=cfg.max_restarts,
        monitor_interval=0.1,
        start_method=start_method or "spawn",
        logs_specs=DefaultLogsSpecs(log_dir=cfg.log_dir, redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template="[rank${rank}]: ",
        local_addr="127.0.0.1",
        **torchapi.shutdown_timeout(cfg.shutdown_timeout),
    )
    try:
        with no_restart_after_fatal(Path(cfg.env[ENV_RUN_DIR])), _scratch(not cfg.fork):
            start_forkserver(start_method)
            try:
                elastic_launch(config, entrypoint=entry)(*args)
            finally:
                stop_forkserver(start_method)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        return NodeOutcome(
            exit_code=EXIT_FAILED,
            failed_rank=rank,
            failed_local_rank=failure.local_rank,
            failed_exitcode=failure.exitcode,
            failed_message=failure.message if failure.error_file_data else None,
        )
    except SignalException as exc:
        return NodeOutcome(exit_code=128 + int(exc.sigval), signal=int(exc.sigval))
    return NodeOutcome(exit_code=EXIT_OK)


@contextlib.contextmanager
def _scratch(own: bool) -> Iterator[None]:
    """With ``own``: the workers' $TMPDIR is a directory of this agent's, removed when it
    ends. TensorFlow's autograph writes the modules it generates there and removes them at
    exit, which a killed worker never reaches (PyTorch's workers keep the machine's: its
    compilers' caches there are meant to outlive a run)."""
    if not own:
        yield
        return
    scratch, before = tempfile.mkdtemp(prefix="gpufleet-workers-"), os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = scratch
    try:
        yield
    finally:  # an agent in gpufleet's own process (one node) gives its TMPDIR back
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    """Entry point of a node process: run the agent, write its outcome as JSON."""
    die_with_parent(expected_parent=int(sys.argv[3]))
    cfg = NodeConfig(**json.loads(Path(sys.argv[1]).read_text()))
    outcome = launch_node(cfg)
    Path(sys.argv[2]).write_text(json.dumps(asdict(outcome)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
