"""When `gpufleet bench inference` runs an Offline LoadGen run again (``rerun_rate``), decided
from what real LoadGen writes: an in-process system under test that answers at once, or after
a pause, gives LoadGen's own "Min duration satisfied" verdicts."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.serve.loadgen import BenchConfig, parse_summary, result_of
from gpufleet.serve.loadgen.run import rerun_rate

lg = pytest.importorskip("mlperf_loadgen")

OFFLINE = BenchConfig(url="127.0.0.1:1", model="m", scenario="Offline")


def offline_run(outdir: Path, expected_qps: float, answer_after: float) -> dict[str, str]:
    """LoadGen Offline (minimum 200 ms) against a SUT answering after ``answer_after`` s; its
    summary log, read back."""

    def issue(samples: list) -> None:  # type: ignore[type-arg]
        answers = [lg.QuerySampleResponse(s.id, 0, 0) for s in samples]
        threading.Timer(answer_after, lg.QuerySamplesComplete, [answers]).start()

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = lg.TestMode.PerformanceOnly
    settings.offline_expected_qps = expected_qps
    settings.min_duration_ms = 200
    settings.min_query_count = 1
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(64, 64, lambda _: None, lambda _: None)
    log = lg.LogSettings()
    log.log_output.outdir = str(outdir)
    log.log_output.copy_summary_to_stdout = False
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    return parse_summary(outdir / "mlperf_log_summary.txt")


def test_a_run_that_ended_short_of_its_minimum_runs_again_at_four_times_its_rate(
    tmp_path: Path,
) -> None:
    summary = offline_run(tmp_path, expected_qps=10, answer_after=0)  # 3 samples, at once
    result = result_of(OFFLINE, summary, latencies=[0.001] * 3, errors=[]).to_json()
    assert result["valid"] is False and result["min_duration_met"] is False
    rate = result["samples_per_second"]
    assert rate > 10  # faster than expected: why it ended short
    assert rerun_rate(OFFLINE, result) == pytest.approx(4 * rate)
    # The rate was the user's, the run failed requests, or it was not Offline: no second run.
    assert rerun_rate(replace(OFFLINE, target_qps=10.0), result) is None
    failed = result_of(OFFLINE, summary, latencies=[0.001] * 3, errors=["refused"]).to_json()
    assert rerun_rate(OFFLINE, failed) is None
    assert rerun_rate(replace(OFFLINE, scenario="Server", target_qps=1.0), result) is None


def test_a_run_that_lasted_its_minimum_is_not_run_again(tmp_path: Path) -> None:
    summary = offline_run(tmp_path, expected_qps=10, answer_after=0.3)
    result = result_of(OFFLINE, summary, latencies=[0.3] * 3, errors=[]).to_json()
    assert result["valid"] is True and result["min_duration_met"] is True
    assert rerun_rate(OFFLINE, result) is None
