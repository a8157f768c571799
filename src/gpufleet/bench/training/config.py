"""What one ``gpufleet bench training`` run is asked: the one home of its defaults, read by
the CLI's options and by the worker's own arguments; and the benchmark's fixed rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import FieldError, UserInputError
from gpufleet.runtime.context import PARALLELISM_DEFAULTS, PRECISIONS, STRATEGIES

BENCHMARK = "gpufleet_digits"
TARGET_ACCURACY = 0.97  # top-1 on the held-out 20 % of digits; fixed, as MLPerf's targets are
RESULT_JSON = "training.json"


def choice_help(choices: tuple[str, ...], default: str) -> str:
    """An option's help for a choice the spec may make: ``ddp or fsdp (default: the spec's,
    else ddp).``"""
    return f"{' or '.join(choices)} (default: the spec's, else {default})."


STRATEGY_HELP = choice_help(STRATEGIES, PARALLELISM_DEFAULTS.strategy)
PRECISION_HELP = choice_help(PRECISIONS, PARALLELISM_DEFAULTS.mixed_precision)


def _bad(option: str, message: str) -> UserInputError:
    return UserInputError([FieldError(option, message)])


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """The timed runs (seeds ``seed``, ``seed+1``, ...), their hyperparameters, and where the
    job publishes its MLLOG files (``results``: a directory or an fsspec URI)."""

    runs: int = 5  # MLPerf scores 5 or more
    procs: int = 2  # worker processes per node
    nodes: int = 1
    batch_size: int = 32  # per worker and step
    lr: float = 0.05  # the peak of the cosine schedule
    max_epochs: int = 40  # a run that has not reached the target by then is aborted
    seed: int = 0
    strategy: str | None = None  # one of STRATEGIES; None: the spec's
    precision: str | None = None  # one of PRECISIONS; None: the spec's
    quick: bool = False  # one run
    results: str | None = None
    outdir: Path = Path("bench-results/training")
    org: str = "gpufleet"  # the MLLOG submission fields
    platform: str = ""  # "": <nodes>x<machine>
    config_name: str = "gpufleet bench training"

    def errors(self) -> UserInputError | None:
        """The first option that is wrong, as the error the CLI shows; None if none is."""
        for option, value in (
            ("--runs", self.runs),
            ("--batch-size", self.batch_size),
            ("--max-epochs", self.max_epochs),
        ):
            if value < 1:
                return _bad(option, "must be at least 1")
        if self.lr <= 0:
            return _bad("--lr", "must be positive")
        if self.strategy not in (None, *STRATEGIES):
            return _bad("--strategy", f"must be {' or '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.precision not in (None, *PRECISIONS):
            return _bad("--precision", f"must be {' or '.join(PRECISIONS)}, got {self.precision!r}")
        return None

    def timed_runs(self) -> int:
        """How many runs the job times, after ``quick``."""
        return 1 if self.quick else self.runs
