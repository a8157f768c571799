"""``gpufleet bench collectives``: collective bandwidth the way nccl-tests reports it.

All-reduce, all-gather, reduce-scatter, broadcast and all-to-all over a size sweep, through
``torch.distributed`` (gloo on CPU, nccl with GPUs), each result checked element by element.

The package: ``ops`` (the collectives, sizes, nccl-tests' formulas), ``config``
(CollectivesConfig: every default), ``plan`` (config and spec to the job, pure), ``worker``
(runs inside the job: ``python -m gpufleet.bench.collectives``), ``report`` (table, plot,
JSON) and ``run`` (the command: plan, run here or render, report).
"""

from gpufleet.bench.collectives.config import CollectivesConfig, parse_size
from gpufleet.bench.collectives.ops import (
    ELEMENT,
    OPS,
    Op,
    Row,
    bandwidths,
    elements,
    human_bytes,
    sweep,
)
from gpufleet.bench.collectives.plan import plan
from gpufleet.bench.collectives.report import HEADER, format_row
from gpufleet.bench.collectives.worker import (
    Collective,
    measure,
    run_sweep,
    single_tensor_fns,
    slowest,
    time_calls,
)

__all__ = [
    "ELEMENT",
    "HEADER",
    "OPS",
    "Collective",
    "CollectivesConfig",
    "Op",
    "Row",
    "bandwidths",
    "elements",
    "format_row",
    "human_bytes",
    "measure",
    "parse_size",
    "plan",
    "run_sweep",
    "single_tensor_fns",
    "slowest",
    "sweep",
    "time_calls",
]
