"""``gpufleet bench inference``: MLPerf LoadGen against one Open Inference Protocol endpoint.

Thin: the LoadGen system under test, its settings and outputs are gpufleet.serve.loadgen
(BenchConfig is the one home of LoadGen's defaults, also read by bench coordinated). It runs
in the CLI's process, not as a job, so it has no plan. The package: ``config`` (the
settings), ``report`` (table, JSON) and ``run`` (the command).
"""

from gpufleet.bench.inference.config import DEFAULTS, InferenceConfig

__all__ = ["DEFAULTS", "InferenceConfig"]
