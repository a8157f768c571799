"""``gpufleet bench scaling``: how training throughput grows with workers, and a predictor.

The package: ``model`` (points, efficiency, the alpha-beta predictor: pure), ``config``
(ScalingConfig: every default), ``plan`` (config and spec to one job per point, pure),
``worker`` (runs inside each job: ``python -m gpufleet.bench.scaling``), ``report`` (table,
plot, JSON) and ``run`` (the command: plan, run here or render, report).
"""

from gpufleet.bench.scaling.config import MODES, ScalingConfig
from gpufleet.bench.scaling.model import (
    INTERCONNECTS,
    PREDICT_AT,
    Model,
    Point,
    analyze,
    efficiencies,
    fit_alpha_beta,
    hidden_fraction,
    ring_allreduce_seconds,
)
from gpufleet.bench.scaling.plan import PointJob, plan, plan_points
from gpufleet.bench.scaling.worker import point_file

__all__ = [
    "INTERCONNECTS",
    "MODES",
    "PREDICT_AT",
    "Model",
    "Point",
    "PointJob",
    "ScalingConfig",
    "analyze",
    "efficiencies",
    "fit_alpha_beta",
    "hidden_fraction",
    "plan",
    "plan_points",
    "point_file",
    "ring_allreduce_seconds",
]
