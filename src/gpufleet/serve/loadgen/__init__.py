"""``gpufleet bench inference``: MLPerf LoadGen against any Open Inference Protocol v2 endpoint.

LoadGen (``mlcommons-loadgen``) decides when queries go out and judges the run (SingleStream,
Server, Offline); gpufleet is the system under test's client side: each query sample becomes
one asynchronous request through NVIDIA's ``tritonclient`` (gRPC by default, HTTP with an
``http://`` URL), and completes back to LoadGen when the response arrives. In-flight requests
are capped (``concurrency``) so Offline does not open thousands at once; the server's dynamic
batcher merges what is in flight.

Outputs in ``outdir``: LoadGen's own ``mlperf_log_summary.txt`` and ``mlperf_log_detail.txt``,
``result.json`` (scenario, VALID/INVALID, samples/s or scheduled QPS, latency percentiles),
``latency.png``, and optionally ``result.prom`` (Prometheus text format, for node-exporter's
textfile collector).

The package: ``settings`` (BenchConfig, BenchResult), ``client`` (Target, samples_for), ``run``
(run_bench, calibrate, single_latency) and ``report`` (the outputs).
"""

from gpufleet.serve.loadgen.client import Target, samples_for
from gpufleet.serve.loadgen.report import parse_summary, result_of, write_outputs
from gpufleet.serve.loadgen.run import calibrate, run_bench, single_latency
from gpufleet.serve.loadgen.settings import SCENARIOS, BenchConfig, BenchResult

__all__ = [
    "SCENARIOS",
    "BenchConfig",
    "BenchResult",
    "Target",
    "calibrate",
    "parse_summary",
    "result_of",
    "run_bench",
    "samples_for",
    "single_latency",
    "write_outputs",
]
