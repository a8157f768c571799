"""``gpufleet bench inference`` end to end: one LoadGen run against an endpoint, shown."""

from __future__ import annotations

from gpufleet.errors import EXIT_FAILED
from gpufleet.serve.loadgen.settings import BenchConfig


def run(config: BenchConfig, as_json: bool) -> int:
    """Run LoadGen's scenario and show the result; the exit code: 0 if VALID, 1 if not."""
    from gpufleet.bench.inference.report import show
    from gpufleet.serve.loadgen import run_bench

    result = run_bench(config)
    show(config, result, as_json)
    return 0 if result.valid else EXIT_FAILED
