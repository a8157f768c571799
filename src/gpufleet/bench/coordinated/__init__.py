"""``gpufleet bench coordinated``: MLPerf LoadGen on every node at once, results merged.

The package: ``config`` (CoordinatedConfig; LoadGen's defaults are BenchConfig's), ``plan``
(config and spec to the job, pure), ``worker`` (runs on each node: ``python -m
gpufleet.bench.coordinated``), ``report`` (the merge, table, JSON) and ``run`` (the command).
"""

from gpufleet.bench.coordinated.config import LOADGEN_DEFAULTS, CoordinatedConfig
from gpufleet.bench.coordinated.plan import plan
from gpufleet.bench.coordinated.report import merge, table

__all__ = ["LOADGEN_DEFAULTS", "CoordinatedConfig", "merge", "plan", "table"]
