"""Run LoadGen: the SUT and QSL callbacks, the expectations LoadGen sizes a run from
(measured when not given), and the outputs."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpufleet.errors import UserInputError
from gpufleet.runtime import faults
from gpufleet.serve.loadgen.client import ClientTls, Target, samples_for
from gpufleet.serve.loadgen.report import parse_summary, result_of, write_outputs
from gpufleet.serve.loadgen.settings import BenchConfig, BenchResult


def run_bench(
    cfg: BenchConfig, start_line: Callable[[], None] | None = None, *, again: bool = True
) -> BenchResult:
    """Run LoadGen for ``cfg`` and write its logs and gpufleet's outputs into ``cfg.outdir``.
    ``start_line``, when given, is called after the endpoint is measured and just before LoadGen
    starts (a coordinated run waits there for every node). ``again``: an Offline run that ended
    short of its minimum duration because the measured rate was too low runs once more,
    expecting ``rerun_rate`` (a coordinated run decides that for all its nodes at once)."""
    import mlperf_loadgen as lg

    errors = cfg.errors()
    if errors:
        raise UserInputError(errors)
    tls = None
    if cfg.tls_ca is not None:
        cert, key = (str(p) if p else None for p in (cfg.tls_cert, cfg.tls_key))
        tls = ClientTls(str(cfg.tls_ca), cert, key)
    target = Target(cfg.url, cfg.model, cfg.concurrency, tls)
    try:
        data = samples_for(target, cfg.samples, cfg.seed)
        requests = [target.request(s) for s in data]
        result = _run(cfg, target, requests, lg, start_line)
        rate = rerun_rate(cfg, result.to_json()) if again else None
        if rate is not None:
            say_rerun(result.to_json(), rate)
            result = _run(replace(cfg, target_qps=rate), target, requests, lg, start_line)
        return result
    finally:
        target.close()


# How much more than the short run's own rate a second Offline run expects. That rate is itself
# low: a run that ended early is mostly its start. A coordinated run on 2 busy cores once went
# 3.1 times faster the second time, so twice was too little (its second run ended short too).
RERUN_FACTOR = 4.0


def rerun_rate(cfg: BenchConfig, result: dict[str, Any]) -> float | None:
    """The rate to expect in a second Offline run, when the first (``result``, a
    BenchResult.to_json()) ended before its minimum duration with no failed request while
    expecting a rate gpufleet measured: RERUN_FACTOR times the rate the run itself reached, as
    LoadGen's own recommendation says ("Increase expected QPS"). A measurement taken while the
    host was busy (a shared machine, the other nodes of a coordinated run starting) can be
    several times too low. None otherwise: a rate the user gave is theirs, and a second run is
    never repeated."""
    if cfg.scenario != "Offline" or cfg.target_qps is not None:
        return None
    if result["valid"] or result["errors"] or result["min_duration_met"] is not False:
        return None
    return RERUN_FACTOR * max(result["samples_per_second"] or 0.0, 1.0)


def say_rerun(result: dict[str, Any], rate: float) -> None:
    print(
        f"LoadGen Offline at {result['url']}: the run ended before its minimum duration "
        f"(the endpoint did {result['samples_per_second'] or 0:.0f} samples/s, more than "
        f"measured before it); running again expecting {rate:.0f} samples/s",
        file=sys.stderr,
        flush=True,
    )


def _settings(cfg: BenchConfig, target: Target, requests: list[list[Any]], lg: Any) -> Any:
    """LoadGen's TestSettings for the scenario, with the estimates it needs measured."""
    duration, min_queries = cfg.effective()
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, cfg.scenario)
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(duration * 1000)
    settings.min_query_count = min_queries
    settings.performance_sample_count_override = len(requests)
    if cfg.scenario == "Server":
        settings.server_target_qps = float(cfg.target_qps or 0)
        settings.server_target_latency_ns = int(cfg.latency_ms * 1e6)
        settings.server_target_latency_percentile = 0.99
    elif cfg.scenario == "Offline":
        # LoadGen issues expected_qps x min_duration x 1.1 samples at once; too low an estimate
        # ends the run before its minimum duration (INVALID), so measure one when none is given,
        # and take twice it: the run then lasts about twice its minimum, and still meets it when
        # the endpoint goes faster than it did while measured.
        settings.offline_expected_qps = float(
            cfg.target_qps or 2.0 * calibrate(target, requests, cfg.concurrency)
        )
    else:  # LoadGen pre-generates min_duration / expected latency queries: measure it, and
        # halve it so the run still lasts its minimum when queries go faster than measured
        settings.single_stream_expected_latency_ns = int(0.5e9 * single_latency(target, requests))
    if cfg.quick:  # LoadGen's early-stopping and its long minimums are for real submissions
        settings.max_duration_ms = int(max(duration, 1) * 10_000)
    return settings


def _run(
    cfg: BenchConfig,
    target: Target,
    requests: list[list[Any]],
    lg: Any,
    start_line: Callable[[], None] | None,
) -> BenchResult:
    settings = _settings(cfg, target, requests, lg)
    in_flight = threading.BoundedSemaphore(max(cfg.concurrency, 1))
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def issue(query_samples: list[Any]) -> None:
        for qs in query_samples:
            in_flight.acquire()
            started = time.perf_counter()
            sample_id = qs.id

            def done(error: Any, sample_id: int = sample_id, started: float = started) -> None:
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    if error is not None:
                        errors.append(str(error)[:300])
                in_flight.release()
                lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])

            try:
                target.infer_async(requests[qs.index], done)
            except Exception as exc:  # e.g. the connection is gone: complete it as failed
                done(exc)

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(len(requests), len(requests), lambda _: None, lambda _: None)
    cfg.outdir.mkdir(parents=True, exist_ok=True)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(cfg.outdir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    if start_line is not None:
        start_line()
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    summary = parse_summary(cfg.outdir / "mlperf_log_summary.txt")
    result = result_of(cfg, summary, latencies, errors)
    write_outputs(result, latencies, cfg.prometheus)
    return result


def calibrate(
    target: Target, requests: list[list[Any]], concurrency: int, seconds: float = 1.0
) -> float:
    """Samples/s the endpoint sustains for ``seconds`` at ``concurrency`` requests in flight
    (after a warm-up of ``concurrency`` requests, so first-call costs do not lower it)."""
    for i in range(max(concurrency, 1)):
        target.infer(requests[i % len(requests)])
    in_flight = threading.BoundedSemaphore(max(concurrency, 1))
    done_count = [0]
    lock = threading.Lock()

    def done(_: Any) -> None:
        with lock:
            done_count[0] += 1
        in_flight.release()

    started = time.perf_counter()
    sent = 0
    while time.perf_counter() - started < seconds:
        in_flight.acquire()
        target.infer_async(requests[sent % len(requests)], done)
        sent += 1
    for _ in range(max(concurrency, 1)):  # wait for the rest
        in_flight.acquire()
    rate = done_count[0] / (time.perf_counter() - started)
    if faults.active("slow", "calibrate", 1):
        rate /= faults.SLOWDOWN
    return max(rate, 1.0)


def single_latency(target: Target, requests: list[list[Any]], count: int = 20) -> float:
    """Median seconds of ``count`` requests sent one at a time."""
    times = []
    for i in range(count):
        started = time.perf_counter()
        target.infer(requests[i % len(requests)])
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]
