"""Export a trained digits model to a Triton repository, serve it with real Triton (PyTriton),
and check what clients and attackers get: the official tritonclient (HTTP and gRPC) receives the
model's own outputs; hostile requests get an error and the server keeps serving, within bounded
memory; the model-repository API is closed."""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.errors import EXIT_FAILED
from gpufleet.net import free_port
from gpufleet.runtime.faults import ENV_FAULTS
from gpufleet.serve.export import export
from gpufleet.serve.repository import Batching, read_repository
from gpufleet.serve.server import Endpoints, ServeConfig, serving
from gpufleet.workloads.digits import DigitsCNN, digits_datasets
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.oip import HOSTILE, INFER, MODEL, infer_body, is_parse_error, post, ready
from tests.support.triton import cli_serve, start_cli_serve, trained_checkpoint

pytestmark = pytest.mark.slow
tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("pytriton")


@dataclass
class Served:
    endpoints: Endpoints
    model: DigitsCNN
    images: np.ndarray[Any, Any]
    server: psutil.Process  # tritonserver

    @property
    def host(self) -> str:
        return self.endpoints.http.removeprefix("http://")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("serving")
    model = trained_checkpoint(base / "run" / "checkpoints")
    entry, _ = export(
        str(base / "run"),
        base / "repo",
        model=MODEL,
        batching=Batching(max_batch_size=64, preferred_batch_sizes=(16, 32, 64)),
    )
    assert entry.directory == base / "repo" / MODEL
    _, test = digits_datasets(0)
    config = ServeConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=base / "triton.log",
    )
    with serving(base / "repo", config) as endpoints:
        server = next(
            p for p in psutil.Process().children(recursive=True) if p.name() == "tritonserver"
        )
        yield Served(endpoints, model, test.tensors[0].numpy(), server)


def expected(served: Served, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with torch.no_grad():
        return served.model(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def test_repository_has_the_triton_layout(served: Served) -> None:
    (entry,) = served.endpoints.models
    assert (entry.directory / "config.pbtxt").is_file()
    assert (entry.directory / "1" / "model.pt").is_file()
    (again,) = read_repository(entry.directory.parent)
    assert again.config.backend == "pytorch"
    assert again.batching.preferred_batch_sizes == (16, 32, 64)
    assert [t.name for t in again.inputs] == ["INPUT__0"] and again.inputs[0].dims == (1, 8, 8)
    assert again.outputs[0].dims == (10,)


def test_http_client_gets_the_models_outputs(served: Served) -> None:
    client = tritonclient_http.InferenceServerClient(served.host)
    try:
        for x in (served.images[:1], served.images[:64]):
            inp = tritonclient_http.InferInput("INPUT__0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            got = client.infer(MODEL, [inp]).as_numpy("OUTPUT__0")
            np.testing.assert_allclose(got, expected(served, x), rtol=1e-5, atol=1e-5)
            assert (got.argmax(1) == expected(served, x).argmax(1)).all()
        meta = client.get_model_metadata(MODEL)
        assert meta["inputs"][0]["shape"] == [-1, 1, 8, 8]
    finally:
        client.close()


def test_grpc_client_gets_the_models_outputs(served: Served) -> None:
    client = tritonclient_grpc.InferenceServerClient(served.endpoints.grpc)
    try:
        x = served.images[100:132]
        inp = tritonclient_grpc.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(MODEL, [inp]).as_numpy("OUTPUT__0")
        np.testing.assert_allclose(got, expected(served, x), rtol=1e-5, atol=1e-5)
    finally:
        client.close()


@pytest.mark.parametrize("shape", [[64, 1, 8, 1099511627776], [0, 1, 8, 1099511627776]])
def test_grpc_refuses_a_shape_bomb_itself(served: Served, shape: list[int]) -> None:
    """gRPC is not behind the guard: Triton's core checks a shape against the config before it
    allocates anything there (the HTTP crash was its JSON parser), so the request that killed
    tritonserver over HTTP is INVALID_ARGUMENT over gRPC and the server lives on."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(served.endpoints.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="INPUT__0", datatype="FP32", shape=shape)
        request.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unexpected shape" in str(info.value.details())
    assert served.server.is_running() and ready(served.endpoints.http)


def test_clients_cannot_unload_or_load_models(served: Served) -> None:
    client = tritonclient_http.InferenceServerClient(served.host)
    try:
        with pytest.raises(tritonclient_http.InferenceServerException, match="restricted"):
            client.unload_model(MODEL)
        with pytest.raises(tritonclient_http.InferenceServerException, match="restricted"):
            client.load_model(MODEL)
        assert client.is_model_ready(MODEL)
    finally:
        client.close()
    grpc = tritonclient_grpc.InferenceServerClient(served.endpoints.grpc)
    try:
        with pytest.raises(tritonclient_grpc.InferenceServerException, match="restricted"):
            grpc.unload_model(MODEL)
    finally:
        grpc.close()


RESTRICTED_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")


def test_the_access_token_is_not_in_tritons_process_list(served: Served) -> None:
    """Every local user can read /proc/<pid>/cmdline, and the restricted-API key was there
    (issue 13: with it the repository API answered 200). Now argv shows a random placeholder
    that the restricted API refuses, while the models loaded through that same API with the real
    key; neither tritonserver nor the backend stubs it started keep the key or the preload."""
    argv = served.server.cmdline()
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here to build the argv shim (serve warns instead: tested)")
    flags = [value for name, value in itertools.pairwise(argv) if name in RESTRICTED_FLAGS]
    assert len(flags) == 2, argv
    (shown,) = {flag.rsplit("=", 1)[1] for flag in flags}
    assert shown.startswith("gpufleet-placeholder-"), flags
    assert served.endpoints.warnings == ()
    index = urllib.request.Request(
        f"{served.endpoints.backend_http}/v2/repository/index",
        method="POST",
        headers={"triton-access-token": shown},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(index, timeout=10)
    assert "restricted" in refused.value.read().decode(), refused.value
    assert ready(served.endpoints.http)  # every model READY, loaded with the real key
    # /proc/<pid>/environ is the environment tritonserver started with: the key's bytes zeroed.
    assert served.server.environ().get("GPUFLEET_ARGV_SECRET", "") == ""
    stubs = served.server.children(recursive=True)
    assert stubs, "PyTriton's models run in Python backend stubs started by tritonserver"
    for stub in stubs:
        environment = stub.environ()
        assert not [k for k in environment if k.startswith("GPUFLEET_ARGV")], stub
        assert "argv-shim" not in environment.get("LD_PRELOAD", ""), stub


@pytest.mark.parametrize(("label", "path", "body", "status"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_request_gets_an_error_and_the_server_keeps_serving(
    served: Served, label: str, path: str, body: bytes, status: int
) -> None:
    code, answer = post(served.endpoints.http, path, body)
    assert code == status, (label, code, answer)
    assert answer.get("error"), answer
    assert code != 500 or is_parse_error(answer), answer
    good, result = post(served.endpoints.http, INFER, infer_body([1, 1, 8, 8]))
    assert good == 200 and result["outputs"][0]["shape"] == [1, 10]


def test_memory_stays_bounded_under_a_hostile_loop(served: Served) -> None:
    bodies = [body for _, path, body, _ in HOSTILE if path == INFER and len(body) < 1 << 20]
    for body in bodies * 5:  # warm up allocator pools
        post(served.endpoints.http, INFER, body)
    before = served.server.memory_info().rss
    for body in bodies * 60:
        post(served.endpoints.http, INFER, body)
    after = served.server.memory_info().rss
    assert (after - before) < 64 << 20, f"tritonserver grew {(after - before) >> 20} MB"
    code, _ = post(served.endpoints.http, INFER, infer_body([2, 1, 8, 8]))
    assert code == 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT__0", "OUTPUT__0", "", "x"]),
        "shape": st.lists(st.integers(-2, 70), max_size=5),
        "datatype": st.sampled_from(["FP32", "FP16", "INT64", "BYTES", "BOOL", "nope"]),
        "data": st.lists(st.floats(allow_nan=False, width=32) | st.integers(), max_size=80),
    }
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.lists(tensor, max_size=3).map(lambda ts: json.dumps({"inputs": ts}).encode()),
    )
)
def test_fuzzed_bodies_never_break_the_server(served: Served, body: bytes) -> None:
    """Any body: a 4xx, or a 500 only from Triton's request parser (PARSE_ERRORS_500); the
    server stays ready and serves the next good request, within bounded memory."""
    before = FUZZ_RSS.setdefault("before", served.server.memory_info().rss)
    code, answer = post(served.endpoints.http, INFER, body)
    assert code in (200, 400, 404, 500), code
    if code == 500:
        assert is_parse_error(answer), f"a 500 that is not a request-parsing error: {answer}"
    assert served.server.is_running() and ready(served.endpoints.http)
    good, _ = post(served.endpoints.http, INFER, infer_body([1, 1, 8, 8]))
    assert good == 200
    grown = served.server.memory_info().rss - before
    assert grown < 64 << 20, f"tritonserver grew {grown >> 20} MB over the fuzzed requests"


FUZZ_RSS: dict[str, int] = {}  # tritonserver's RSS before the first fuzzed request


# The latency bound of the Server-scenario tests that expect VALID. These tests check that
# LoadGen runs, schedules and merges, not how fast a shared 2-core machine answers: a quick run
# issues 700 queries, and at that count LoadGen's early stopping allows one over the bound
# (tried: a SUT holding back 2 of 700 gets INVALID), so two stalls of the host fail the run.
# With a torch job beside it, the slowest of 700 queries took 65-86 ms; the old 100 ms bound
# failed 1 full parallel suite in 5. Latency is measured by benchmarks/, never asserted here.
SMOKE_LATENCY_MS = "2000"
GZIP_JSON = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


def test_a_gzip_bomb_is_refused_and_gzip_still_works(served: Served) -> None:
    """A small gzip body that expands past the bound (64 MiB of zeros in 64 KB; 2 GiB in 2 MB
    killed tritonserver) is 413 from the guard; a real gzip request is answered."""
    bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9)
    assert len(bomb) < 1 << 20
    code, answer = post(served.endpoints.http, INFER, bomb, GZIP_JSON)
    assert code == 413 and "expands to more than" in answer["error"], (code, answer)
    body = gzip.compress(infer_body([2, 1, 8, 8]))
    code, answer = post(served.endpoints.http, INFER, body, GZIP_JSON)
    assert code == 200 and answer["outputs"][0]["shape"] == [2, 10], answer
    assert served.server.is_running()


def test_a_chunked_body_needs_a_length(served: Served) -> None:
    parts = urllib.parse.urlsplit(served.endpoints.http)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", INFER, body=iter([infer_body([1, 1, 8, 8])]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 411 and b"Content-Length" in resp.read()
    finally:
        conn.close()


def test_readiness_is_every_model_ready_not_an_open_port() -> None:
    """The guard answers /v2/health/ready itself: with Triton unreachable it is 503, where an
    open port alone used to say 200."""
    from gpufleet.serve.guard import Limits, start_guard

    guard, _ = start_guard("127.0.0.1", 0, free_port(), Limits(1 << 20, {}), ["digits"])
    try:
        code, answer = get(f"http://127.0.0.1:{guard.server_port}/v2/health/ready")
        assert code == 503 and "Triton did not answer" in answer["error"], answer
    finally:
        guard.shutdown()
        guard.server_close()


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read() or b"{}")


# The codes `gpufleet serve` may answer a bad request with (docs/serving.md): Triton's 400,
# 404 and request-parsing 500s, the guard's 400 (shape), 411 (no length), 413 (too large) and
# 415 (an encoding other than gzip or deflate; Triton answered those 501).
DOCUMENTED = {200, 400, 404, 411, 413, 415, 500}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    headers=st.fixed_dictionaries(
        {},
        optional={
            "Content-Encoding": st.sampled_from(["gzip", "deflate", "br", "identity", "x"]),
            "Inference-Header-Content-Length": st.sampled_from(["0", "5", "-1", "x", "99999"]),
            "Content-Type": st.sampled_from(["application/json", "text/plain", ""]),
        },
    ),
    body=st.one_of(
        st.binary(max_size=200),
        st.lists(tensor, max_size=2).map(lambda ts: json.dumps({"inputs": ts}).encode()),
    ),
    compress=st.booleans(),
)
def test_fuzzed_headers_never_break_the_server(
    served: Served, headers: dict[str, str], body: bytes, compress: bool
) -> None:
    """Random encodings, header lengths and content types over random bodies: only documented
    codes, 500 only from Triton's request parser; the server stays ready."""
    if compress and headers.get("Content-Encoding") in ("gzip", "deflate"):
        body = gzip.compress(body) if headers["Content-Encoding"] == "gzip" else zlib.compress(body)
    code, answer = post(served.endpoints.http, INFER, body, headers)
    assert code in DOCUMENTED, (code, answer)
    if code == 500:
        assert is_parse_error(answer), f"a 500 that is not a request-parsing error: {answer}"
    assert served.server.is_running() and ready(served.endpoints.http)


# -- LoadGen --------------------------------------------------------------------------------


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


def test_triton_metrics_are_served_with_the_recorded_names(served: Served) -> None:
    """The recorded Triton metric names (dashboards and autoscaling read them) are real."""
    import re

    from tests.support.metric_names import triton

    post(served.endpoints.http, INFER, infer_body([1, 1, 8, 8]))
    with urllib.request.urlopen(served.endpoints.metrics, timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    live = {m.group(1) for line in lines if (m := re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", line))}
    assert triton() <= live, sorted(triton() - live)
    assert any(line.startswith('nv_inference_request_success{model="digits"') for line in lines)


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
