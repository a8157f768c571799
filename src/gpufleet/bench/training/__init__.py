"""``gpufleet bench training``: MLPerf Training-style time to target, the digits CNN (its one
recipe: gpufleet.workloads.digits.digits_recipe) to 97% test accuracy on every node at once.

The package: ``config`` (TrainingConfig: every default; the benchmark's fixed rules),
``plan`` (config and spec to the job, pure), ``worker`` (runs inside the job: ``python -m
gpufleet.bench.training``), ``mllog`` (its MLLOG events), ``report`` (the collector, score,
table, plot) and ``run`` (the command). The compliance ruleset is gpufleet.bench.mlperf.
"""

from gpufleet.bench.training.config import (
    BENCHMARK,
    RESULT_JSON,
    TARGET_ACCURACY,
    TrainingConfig,
)
from gpufleet.bench.training.plan import plan
from gpufleet.bench.training.report import collect, olympic_minutes, table

__all__ = [
    "BENCHMARK",
    "RESULT_JSON",
    "TARGET_ACCURACY",
    "TrainingConfig",
    "collect",
    "olympic_minutes",
    "plan",
    "table",
]
