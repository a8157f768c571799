"""The served digits model through gpufleet's own commands: `gpufleet bench inference` (MLPerf
LoadGen: Offline, Server and SingleStream, over gRPC and HTTP; valid, invalid, bad input, a run
measured too slow and run again) and `bench coordinated` on two nodes at once; and `gpufleet
serve` as users run it on the same model repository (its ready line, SIGTERM, no C compiler,
Triton dying under it). The requests of clients and attackers: test_serving.py."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpufleet.errors import EXIT_FAILED
from gpufleet.runtime.faults import ENV_FAULTS
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.oip import MODEL
from tests.support.triton import Served, cli_serve, start_cli_serve

pytestmark = pytest.mark.slow
pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("pytriton")

# The latency bound of the Server-scenario tests that expect VALID. These tests check that
# LoadGen runs, schedules and merges, not how fast a shared 2-core machine answers: a quick run
# issues 700 queries, and at that count LoadGen's early stopping allows one over the bound
# (tried: a SUT holding back 2 of 700 gets INVALID), so two stalls of the host fail the run.
# With a torch job beside it, the slowest of 700 queries took 65-86 ms; the old 100 ms bound
# failed 1 full parallel suite in 5, and 2000 ms failed a coordinated run beside the real-node
# tests (its HTTP node's 99.9th percentile 2.3 s, early stopping not met). Latency is measured
# by benchmarks/, never asserted here.
SMOKE_LATENCY_MS = "10000"


def bench(served: Served, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    out = tmp_path / "loadgen"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "inference",
            "--model",
            MODEL,
            "--quick",
            "--outdir",
            str(out),
            "-o",
            "json",
            *args,
        ],
    )
    data = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    return result.exit_code, data, result.output


def test_loadgen_offline_over_grpc_is_valid_with_all_outputs(
    served: Served, tmp_path: Path
) -> None:
    code, result, output = bench(
        served, tmp_path, "--url", served.endpoints.grpc, "--scenario", "Offline", "--prometheus"
    )
    assert code == 0, output
    assert result["result"] == "VALID" and result["errors"] == 0
    assert result["samples_per_second"] > 0 and result["queries"] >= 64
    out = tmp_path / "loadgen"
    summary = (out / "mlperf_log_summary.txt").read_text()
    assert "Scenario : Offline" in summary and "Result is : VALID" in summary
    assert (out / "mlperf_log_detail.txt").stat().st_size > 0
    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prom = (out / "result.prom").read_text()
    assert 'gpufleet_loadgen_valid{model="digits",scenario="Offline"} 1.0' in prom
    import shutil
    import subprocess

    if shutil.which("promtool"):
        check = subprocess.run(
            ["promtool", "check", "metrics"],
            input=prom,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr


def server_bench(
    served: Served, tmp_path: Path, qps: str, latency_ms: str
) -> tuple[int, dict[str, Any], str]:
    return bench(
        served,
        tmp_path,
        "--url",
        served.endpoints.grpc,
        "--scenario",
        "Server",
        "--target-qps",
        qps,
        "--latency-ms",
        latency_ms,
    )


def test_loadgen_server_reachable_target_is_valid(served: Served, tmp_path: Path) -> None:
    code, result, output = server_bench(served, tmp_path, "100", SMOKE_LATENCY_MS)
    assert code == 0, output
    assert result["result"] == "VALID"
    assert 80 < result["scheduled_qps"] < 120
    assert result["latency_bound_ms"] == float(SMOKE_LATENCY_MS)
    assert 0 < result["latency_ms"]["p99"] <= result["latency_bound_ms"]


def test_loadgen_server_impossible_target_is_invalid(served: Served, tmp_path: Path) -> None:
    code, result, output = server_bench(served, tmp_path, "3000", "1")
    assert code == 1, output
    assert result["result"] == "INVALID" and result["valid"] is False
    summary = (tmp_path / "loadgen" / "mlperf_log_summary.txt").read_text()
    assert "Result is : INVALID" in summary


def test_loadgen_single_stream_over_http(served: Served, tmp_path: Path) -> None:
    code, result, output = bench(
        served, tmp_path, "--url", served.endpoints.http, "--scenario", "SingleStream"
    )
    assert code == 0, output
    assert result["result"] == "VALID" and result["latency_ms"]["p50"] > 0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--url", "127.0.0.1:1", "--scenario", "Offline"], "--url"),
        (["--model", "nope", "--scenario", "Offline"], "--url/--model"),
        (["--scenario", "MultiStream"], "--scenario"),
        (["--scenario", "Server"], "--target-qps"),
    ],
)
def test_loadgen_bad_input_exits_2_with_the_field(
    served: Served, tmp_path: Path, args: list[str], field: str
) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    full = [
        "bench",
        "inference",
        "--url",
        served.endpoints.grpc,
        "--model",
        MODEL,
        "--quick",
        "--outdir",
        str(tmp_path),
        *args,
    ]
    result = CliRunner().invoke(app, full)
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert "Traceback" not in result.output


def exit_on_sigterm(proc: subprocess.Popen[str]) -> int:
    """SIGTERM, as systemd or the kubelet stops it; the exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def test_cli_serve_reports_its_endpoints_and_stops_on_sigterm(
    served: Served, tmp_path: Path
) -> None:
    """`gpufleet serve` as users run it: ready line (printed only once every model answers
    READY), health 200, SIGTERM -> exit 0."""
    repo = served.endpoints.models[0].directory.parent
    with cli_serve(repo, tmp_path) as (proc, ports, lines):
        assert any(f"HTTP http://127.0.0.1:{ports[0]}" in line for line in lines), lines
        with urllib.request.urlopen(
            f"http://127.0.0.1:{ports[0]}/v2/models/digits/ready", timeout=10
        ) as r:
            assert r.status == 200
        assert exit_on_sigterm(proc) == 0


def test_cli_serve_without_a_compiler_serves_and_says_the_token_shows(
    served: Served, tmp_path: Path
) -> None:
    """No C compiler for the argv shim: serving still works, and one warning line says what is
    left exposed and the fix, before the ready line."""
    repo = served.endpoints.models[0].directory.parent
    with cli_serve(repo, tmp_path, CC="/bin/false") as (proc, _, lines):
        assert lines and lines[-1].startswith("serving:"), lines
        warnings = [line for line in lines if line.startswith("warning:")]
        assert warnings == [
            "warning: the Triton access token is visible in the process list (/bin/false "
            "failed: no output); a working C compiler (cc, or $CC) hides it\n"
        ], lines
        assert exit_on_sigterm(proc) == 0


def test_cli_serve_exits_non_zero_when_triton_dies(served: Served, tmp_path: Path) -> None:
    """tritonserver killed under it (as a hostile request once did): `gpufleet serve` lived on
    with its ports closed and exited 0 on SIGTERM, so no supervisor restarted it. Now it exits
    1 at once, in one line naming Triton's log."""
    repo = served.endpoints.models[0].directory.parent
    proc, _, lines = start_cli_serve(repo, tmp_path)
    try:
        assert lines and lines[-1].startswith("serving:"), lines
        tritons = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if c.name() == "tritonserver"]  # fmt: skip
        assert len(tritons) == 1, tritons
        tritons[0].kill()
        proc.wait(timeout=60)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == EXIT_FAILED, err
        assert "error: Triton exited unexpectedly; its log" in err, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def test_an_offline_run_measured_too_slow_runs_again_and_is_valid(
    served: Served, tmp_path: Path
) -> None:
    """The endpoint's rate measured 100 times too low (as on a busy host): LoadGen's run ends
    before its minimum duration (INVALID), so gpufleet runs it once more expecting twice the
    rate the run reached, and that run is VALID. It once ended INVALID, in 1 full suite of 6."""
    out = tmp_path / "loadgen"
    args = ["--url", served.endpoints.grpc, "--model", MODEL, "--scenario", "Offline", "--quick"]
    proc = subprocess.run(
        gpufleet_cmd("bench", "inference", *args, "--outdir", str(out), "-o", "json"),
        cwd=tmp_path,
        env={**cli_env(), ENV_FAULTS: "slow@calibrate=1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpufleet-fault: slow at calibrate=1" in proc.stderr
    assert "ended before its minimum duration" in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["valid"] and result["min_duration_met"] is True
    assert result["target_qps"] > 0  # the second run's expectation, from the first's rate
    assert "Min duration satisfied : Yes" in (out / "mlperf_log_summary.txt").read_text()


@pytest.mark.parametrize(
    ("scenario", "extra", "rate_key"),
    [
        ("Offline", [], "samples_per_second"),
        ("Server", ["--target-qps", "40", "--latency-ms", SMOKE_LATENCY_MS], "scheduled_qps"),
    ],
)
def test_coordinated_loadgen_runs_on_every_node_at_once_and_merges(
    served: Served, tmp_path: Path, scenario: str, extra: list[str], rate_key: str
) -> None:
    """Two "nodes" on loopback (two agents, one rendezvous), node 0 on Triton's gRPC endpoint
    and node 1 on its HTTP one: both run LoadGen from the same start line, rank 0 gathers and
    merges; every node's own LoadGen logs are kept. Offline: node 1 measures its endpoint 100
    times too slow (as on a busy host) and runs short, so both nodes run again, together."""
    out = tmp_path / "res"
    urls = f"{served.endpoints.grpc},{served.endpoints.http}"
    args = ["--urls", urls, "--model", MODEL, "--scenario", scenario, *extra, "--quick"]
    faults = {ENV_FAULTS: "slow@calibrate=1,rank=1"} if scenario == "Offline" else {}
    proc = subprocess.run(
        gpufleet_cmd("bench", "coordinated", *args, "--outdir", str(out), "-o", "json"),
        cwd=tmp_path,
        env={**cli_env(), **faults},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = json.loads(proc.stdout)
    nodes, agg = merged["nodes"], merged["aggregate"]
    assert [n["node"] for n in nodes] == [0, 1]
    assert [n["url"] for n in nodes] == [served.endpoints.grpc, served.endpoints.http]
    assert all(n["valid"] and n["errors"] == 0 and n["queries"] > 0 for n in nodes)
    assert agg["valid"] and agg["nodes"] == 2 and agg["rate_key"] == rate_key
    assert agg["aggregate_rate"] == pytest.approx(sum(n[rate_key] for n in nodes))
    assert agg["queries"] == sum(n["queries"] for n in nodes)
    assert agg["worst_latency_ms"]["p99"] == max(n["latency_ms"]["p99"] for n in nodes)
    assert agg["start_skew_seconds"] >= 0
    for n in nodes:
        assert (out / f"node-{n['node']}" / "mlperf_log_summary.txt").is_file()
        assert n["system"]["torch"] and n["system"]["cores"]
    if scenario == "Offline":  # both ran again, each expecting twice its own first rate
        short = [ln for ln in proc.stderr.splitlines() if "ended before its minimum" in ln]
        assert any(ln.startswith("[rank1]:") for ln in short), proc.stderr
        assert all(n["target_qps"] and n["min_duration_met"] for n in nodes)
    if scenario == "Server":
        assert agg["aggregate_rate"] == pytest.approx(80, rel=0.05)  # 2 nodes x 40 scheduled
