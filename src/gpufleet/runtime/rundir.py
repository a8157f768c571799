"""A run directory and every file in it: the one home of their names.

``gpufleet run`` keeps one directory per job (``.gpufleet/runs/<name>``; in a pod,
``/run/gpufleet``); the launcher, the workers and the CLI's progress bar meet there::

    result.json      # rank 0's summary of a finished or preempted run (the Trainer)
    progress.json    # rank 0's latest step, loss and rate (the Trainer; the progress bar)
    preempted.json   # each node's first worker after its preemption checkpoint
    fatal.json       # a worker's error no restart can fix (gpufleet.launch.fatal)
    state.json       # the launcher's record of every launch of the job
    durable.json     # the node's uploader: what reached the durable tier (gpufleet.runtime.durable)
    logs/node<N>/    # the elastic agent's per-rank logs of node N
    nodes/           # the local launcher's hand-off to each node's agent: config, outcome
    metrics/         # workers' job metrics files (prometheus_client multiprocess mode)
    checkpoints/     # checkpoints, unless spec.checkpoint.dir names another place

Imports no torch: the CLI, the spec and the launchers use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.json"
# The launchers (local and in a pod) read it to report "preempted" (exit 75).
PREEMPTED_FILE = "preempted.json"
FATAL_FILE = "fatal.json"
STATE_FILE = "state.json"
DURABLE_FILE = "durable.json"
LOGS_DIR = "logs"
NODES_DIR = "nodes"
METRICS_DIR = "metrics"
# Where checkpoints go when spec.checkpoint.dir does not say.
CHECKPOINTS_DIR = "checkpoints"
# Where ``--fresh`` moves an old run directory (under the run root, beside the job's).
ARCHIVE_DIR = ".archive"


@dataclass(frozen=True)
class RunDir:
    """The files of one run directory, by what they hold."""

    path: Path

    @property
    def result(self) -> Path:
        """Rank 0's result of the run (gpufleet.runtime.reporting.TrainResult as JSON)."""
        return self.path / RESULT_FILE

    @property
    def progress(self) -> Path:
        """Rank 0's latest report: step, steps, loss, samples/s, restarts, time."""
        return self.path / PROGRESS_FILE

    @property
    def preempted(self) -> Path:
        """Written by each node's first worker after a preemption checkpoint."""
        return self.path / PREEMPTED_FILE

    @property
    def fatal(self) -> Path:
        """A worker's fatal error: no restart after it (gpufleet.launch.fatal)."""
        return self.path / FATAL_FILE

    @property
    def state(self) -> Path:
        """The local launcher's record of every launch of this job."""
        return self.path / STATE_FILE

    @property
    def durable(self) -> Path:
        """The node's uploader's state: newest durable step, lag, the last failure."""
        return self.path / DURABLE_FILE

    @property
    def logs(self) -> Path:
        """The agents' per-rank logs, one directory per node."""
        return self.path / LOGS_DIR

    def node_logs(self, node: int) -> Path:
        """The per-rank logs of node ``node``."""
        return self.logs / f"node{node}"

    @property
    def nodes(self) -> Path:
        """The local launcher's files for its node agents (no secret: those go by their
        environment); removed when they end, and by the next launch after a SIGKILL."""
        return self.path / NODES_DIR

    @property
    def metrics(self) -> Path:
        """Where workers write their job metrics files."""
        return self.path / METRICS_DIR

    @property
    def checkpoints(self) -> Path:
        """The default checkpoint directory (spec.checkpoint.dir overrides it)."""
        return self.path / CHECKPOINTS_DIR

    def stale_files(self) -> tuple[Path, ...]:
        """What a previous launch leaves that a new launch must not read as its own: its
        result, progress, preemption mark, fatal error and uploader state."""
        return (self.result, self.preempted, self.progress, self.fatal, self.durable)
