"""The MLLOG side of ``gpufleet bench training``: mlperf-logging's own logger, and the
submission and hyperparameter events every run logs before its clock starts."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from gpufleet.bench.training.config import BENCHMARK, TARGET_ACCURACY
from gpufleet.workloads.digits_data import LR_SCHEDULE, OPTIMIZER


def mllogger(path: Path | None, index: int) -> Any:
    """An MLLogger writing to ``path`` (rank 0), or to nowhere (the other ranks)."""
    from mlperf_logging.mllog.mllog import MLLogger

    logger = logging.getLogger(f"gpufleet.mllog.{index}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.addHandler(logging.FileHandler(path) if path else logging.NullHandler())
    return MLLogger(logger=logger)


def _precision(mixed: str) -> str:
    return "bfloat16" if mixed == "bf16" else "fp32"


def setup_events(
    args: Any,
    *,
    seed: int,
    nodes: int,
    world: int,
    gpus: bool,
    settings: Any,
    train_samples: int,
    eval_samples: int,
    max_steps: int,
) -> list[tuple[str, object]]:
    """The (key, value) events of one run's set-up, in the order MLPerf logs them."""
    from mlperf_logging.mllog import constants as c

    return [
        (c.SUBMISSION_ORG, args.org),
        (c.SUBMISSION_PLATFORM, args.platform or f"{nodes}x{os.uname().machine}"),
        (c.SUBMISSION_DIVISION, "closed"),
        (c.SUBMISSION_STATUS, "onprem"),
        (c.SUBMISSION_BENCHMARK, BENCHMARK),
        ("number_of_nodes", nodes),  # read by mlperf_logging.result_summarizer
        ("accelerators_per_node", world // nodes if gpus else 0),
        (c.SEED, seed),
        (c.GLOBAL_BATCH_SIZE, args.batch_size * world),
        (c.GRADIENT_ACCUMULATION_STEPS, settings.gradient_accumulation),
        (c.MICRO_BATCH_SIZE, args.batch_size // settings.gradient_accumulation),
        (c.TRAIN_SAMPLES, train_samples),
        (c.EVAL_SAMPLES, eval_samples),
        (c.OPT_NAME, OPTIMIZER),
        (c.OPT_BASE_LR, args.lr),
        (c.OPT_LR_DECAY_SCHEDULE, LR_SCHEDULE),
        (c.OPT_LR_DECAY_STEPS, max_steps),
        (c.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, _precision(settings.mixed_precision)),
        # The CNN has no attention; MLPerf 6.1 asks for the field regardless.
        (c.LOWEST_NUMERICAL_PRECISION_IN_ATTN, _precision(settings.mixed_precision)),
        (c.LOWEST_NUMERICAL_PRECISION_IN_COMM, "fp32"),  # both strategies reduce in fp32
        (c.TENSOR_PARALLELISM, 1),
        (c.PIPELINE_PARALLELISM, 1),
        (c.CONTEXT_PARALLELISM, 1),
        (c.EXPERT_PARALLELISM, 1),
        (c.CONFIG_FILENAME, args.config_name),
        ("gpufleet_strategy", settings.strategy),
    ]


class EpochLog:
    """MLLOG's block, epoch and evaluation events around each epoch of a run, evaluating the
    model (``model``, set once the Trainer holds it) at each epoch's end: ``after_step``
    stops the run at the target accuracy."""

    def __init__(
        self, log: Any, test: Any, *, steps_per_epoch: int, samples_per_step: int, max_epochs: int
    ) -> None:
        self.log, self.test = log, test
        self.steps_per_epoch, self.samples_per_step = steps_per_epoch, samples_per_step
        self.max_epochs = max_epochs
        self.history: list[float] = []
        self.model: Any = None

    def start_epoch(self, epoch: int) -> None:
        """Log the start of ``epoch`` (a block of one epoch)."""
        from mlperf_logging.mllog import constants as c

        self.log.start(c.BLOCK_START, metadata={c.FIRST_EPOCH_NUM: epoch, c.EPOCH_COUNT: 1})
        self.log.start(c.EPOCH_START, metadata={c.EPOCH_NUM: epoch})

    def after_step(self, step: int) -> bool:
        """At an epoch's end: log it, evaluate, and say whether the target is reached."""
        from mlperf_logging.mllog import constants as c

        from gpufleet.workloads.digits import accuracy

        if step % self.steps_per_epoch:
            return False
        epoch = step // self.steps_per_epoch
        self.log.end(c.EPOCH_STOP, metadata={c.EPOCH_NUM: epoch})
        self.log.end(c.BLOCK_STOP, metadata={c.FIRST_EPOCH_NUM: epoch})
        self.log.start(c.EVAL_START, metadata={c.EPOCH_NUM: epoch})
        score = accuracy(self.model, self.test)  # every rank: FSDP's forward needs them all
        self.history.append(score)
        meta = {c.EPOCH_NUM: epoch, c.SAMPLES_COUNT: step * self.samples_per_step}
        self.log.event(c.EVAL_ACCURACY, score, metadata=meta)
        self.log.end(c.EVAL_STOP, metadata={c.EPOCH_NUM: epoch})
        if self.reached():
            return True
        if epoch < self.max_epochs:
            self.start_epoch(epoch + 1)
        return False

    def reached(self) -> bool:
        """Whether the last evaluation reached TARGET_ACCURACY."""
        return bool(self.history) and self.history[-1] >= TARGET_ACCURACY
