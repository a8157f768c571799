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
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import FieldError, UserInputError

SCENARIOS = ("SingleStream", "Server", "Offline")
# Triton datatype -> numpy dtype name
NUMPY = {
    "FP32": "float32",
    "FP16": "float16",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "INT16": "int16",
    "INT8": "int8",
    "UINT8": "uint8",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class BenchConfig:
    """One LoadGen run. Durations in seconds; ``quick`` shortens everything for tests."""

    url: str
    model: str
    scenario: str = "Offline"
    target_qps: float | None = None  # Server: the scheduled rate; Offline: expected rate
    latency_ms: float = 100.0  # Server: the 99th-percentile latency bound
    duration: float = 60.0  # LoadGen's min_duration (MLPerf's own rules say 600 s)
    min_queries: int = 1024
    quick: bool = False
    concurrency: int = 64
    samples: int = 1024  # the query sample library: random inputs of the model's shape
    seed: int = 0
    outdir: Path = Path("loadgen")
    prometheus: bool = False

    def errors(self) -> list[FieldError]:
        """Everything wrong with this configuration, named by the CLI option that sets it."""
        errors = []
        if self.scenario not in SCENARIOS:
            errors.append(
                FieldError("--scenario", f"{self.scenario!r}: one of {', '.join(SCENARIOS)}")
            )
        for name, value in (("--duration", self.duration), ("--latency-ms", self.latency_ms)):
            if value <= 0:
                errors.append(FieldError(name, "must be positive"))
        if self.target_qps is not None and self.target_qps <= 0:
            errors.append(FieldError("--target-qps", "must be positive"))
        elif self.scenario == "Server" and not self.target_qps:
            errors.append(FieldError("--target-qps", "required for the Server scenario"))
        if self.min_queries < 1 or self.concurrency < 1:
            errors.append(FieldError("--min-queries/--concurrency", "must be at least 1"))
        return errors

    def effective(self) -> tuple[float, int]:
        """(min duration s, min queries) after ``quick``. A quick Server run still issues 700
        queries: fewer can never pass LoadGen's early-stopping check of the 99th percentile."""
        if self.quick:
            return min(self.duration, 2.0), (700 if self.scenario == "Server" else 64)
        return self.duration, self.min_queries


@dataclass
class BenchResult:
    """What a run measured; ``valid`` is LoadGen's verdict and no failed request."""

    scenario: str
    result: str
    valid: bool
    model: str
    url: str
    samples_per_second: float | None
    scheduled_qps: float | None
    target_qps: float | None
    latency_bound_ms: float | None
    latency_ms: dict[str, float]
    queries: int
    errors: int
    first_error: str | None
    outdir: str
    summary: dict[str, str] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("summary")
        return out


class Target:
    """An Open Inference Protocol v2 endpoint through tritonclient: gRPC for ``host:port`` or
    ``grpc://``, HTTP for ``http://``."""

    def __init__(self, url: str, model: str, concurrency: int) -> None:
        self.http = url.startswith(("http://", "https://"))
        self.url = url
        self.model = model
        self.concurrency = max(concurrency, 1)
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._clients: list[Any] = []
        self._clients_lock = threading.Lock()
        address = self.address = re.sub(r"^(grpc|https?)://", "", url).rstrip("/")
        try:
            if self.http:
                import tritonclient.http as client

                self.client: Any = client.InferenceServerClient(
                    address, concurrency=concurrency, ssl=url.startswith("https")
                )
            else:
                import tritonclient.grpc as client

                self.client = client.InferenceServerClient(address)
        except ImportError as exc:
            raise UserInputError(
                [FieldError("tritonclient", "needs: pip install 'gpufleet[serve]'")]
            ) from exc
        self.lib: Any = client
        try:
            meta = self.client.get_model_metadata(model)
            config = self.client.get_model_config(model)
        except Exception as exc:  # unreachable, unknown model: the server's own words
            self.close()
            raise UserInputError([FieldError("--url/--model", f"{url} {model}: {exc}")]) from exc
        if not self.http:
            from google.protobuf.json_format import MessageToDict

            meta = MessageToDict(meta, preserving_proto_field_name=True)
            config = MessageToDict(config.config, preserving_proto_field_name=True)
        batched = int(config.get("max_batch_size", 0)) > 0
        self.inputs = []
        for t in meta["inputs"]:
            shape = [int(d) for d in t["shape"]][1 if batched else 0 :]
            if t["datatype"] not in NUMPY:
                raise UserInputError(
                    [
                        FieldError(
                            "--model",
                            f"input {t['name']}: datatype {t['datatype']} is not benchmarkable",
                        )
                    ]
                )
            self.inputs.append((t["name"], [max(d, 1) for d in shape], t["datatype"]))
        self.batched = batched

    def request(self, sample: list[Any]) -> list[Any]:
        """InferInputs for one sample (a batch of one when the model batches)."""
        out = []
        for (name, _, datatype), array in zip(self.inputs, sample, strict=True):
            data = array[None] if self.batched else array
            inp = self.lib.InferInput(name, list(data.shape), datatype)
            inp.set_data_from_numpy(data)
            out.append(inp)
        return out

    def infer_async(self, inputs: list[Any], done: Any) -> None:
        """Send; call ``done(error or None)`` when the response is in."""
        if self.http:
            self._pool().submit(self._http_infer, inputs, done)
        else:
            self.client.async_infer(self.model, inputs,
                                    callback=lambda result, error: done(error))  # fmt: skip

    # tritonclient.http runs on gevent, which must not be shared between OS threads (it
    # crashes): HTTP requests go through a pool of threads with one client each.
    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="oip-http")
        return self._executor

    def _http_infer(self, inputs: list[Any], done: Any) -> None:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self.lib.InferenceServerClient(self.address)
            with self._clients_lock:
                self._clients.append(client)
        try:
            client.infer(self.model, inputs)
        except Exception as exc:
            done(exc)
            return
        done(None)

    def infer(self, inputs: list[Any]) -> None:
        self.client.infer(self.model, inputs)

    def close(self) -> None:
        if self._executor is not None:
            workers = len(self._executor._threads)
            barrier = threading.Barrier(workers)

            def close_mine() -> None:  # each worker closes the client it made, in its thread
                barrier.wait(timeout=30)
                client = getattr(self._local, "client", None)
                if client is not None:
                    client.close()

            for _ in range(workers):
                self._executor.submit(close_mine)
            self._executor.shutdown(wait=True)
        self.client.close()


def samples_for(target: Target, count: int, seed: int) -> list[list[Any]]:
    """``count`` random samples with the model's input shapes and dtypes (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        sample = []
        for _, shape, datatype in target.inputs:
            dtype = NUMPY[datatype]
            if dtype.startswith(("int", "uint")):
                sample.append(rng.integers(0, 10, size=shape).astype(dtype))
            elif dtype == "bool":
                sample.append(rng.integers(0, 2, size=shape).astype(bool))
            else:
                sample.append(rng.random(size=shape, dtype=np.float32).astype(dtype))
        out.append(sample)
    return out


def run_bench(cfg: BenchConfig) -> BenchResult:
    """Run LoadGen for ``cfg`` and write its logs and gpufleet's outputs into ``cfg.outdir``."""
    import mlperf_loadgen as lg

    errors = cfg.errors()
    if errors:
        raise UserInputError(errors)
    target = Target(cfg.url, cfg.model, cfg.concurrency)
    try:
        data = samples_for(target, cfg.samples, cfg.seed)
        requests = [target.request(s) for s in data]
        return _run(cfg, target, requests, lg)
    finally:
        target.close()


def _run(cfg: BenchConfig, target: Target, requests: list[list[Any]], lg: Any) -> BenchResult:
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
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    summary = parse_summary(cfg.outdir / "mlperf_log_summary.txt")
    result = _result(cfg, summary, latencies, errors)
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
    return max(done_count[0] / (time.perf_counter() - started), 1.0)


def single_latency(target: Target, requests: list[list[Any]], count: int = 20) -> float:
    """Median seconds of ``count`` requests sent one at a time."""
    times = []
    for i in range(count):
        started = time.perf_counter()
        target.infer(requests[i % len(requests)])
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def parse_summary(path: Path) -> dict[str, str]:
    """``key : value`` lines of LoadGen's summary log."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and value.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def _num(summary: dict[str, str], key: str) -> float | None:
    try:
        return float(summary[key])
    except (KeyError, ValueError):
        return None


def _result(
    cfg: BenchConfig, summary: dict[str, str], latencies: list[float], errors: list[str]
) -> BenchResult:
    verdict = summary.get("Result is", "INVALID")
    ns = {
        "min": "Min latency (ns)",
        "mean": "Mean latency (ns)",
        "max": "Max latency (ns)",
        "p50": "50.00 percentile latency (ns)",
        "p90": "90.00 percentile latency (ns)",
        "p95": "95.00 percentile latency (ns)",
        "p99": "99.00 percentile latency (ns)",
        "p99.9": "99.90 percentile latency (ns)",
    }
    latency = {k: v / 1e6 for k, key in ns.items() if (v := _num(summary, key)) is not None}
    return BenchResult(
        scenario=cfg.scenario,
        result=verdict if not errors else "INVALID",
        valid=verdict == "VALID" and not errors,
        model=cfg.model,
        url=cfg.url,
        samples_per_second=_num(summary, "Samples per second"),
        scheduled_qps=_num(summary, "Scheduled samples per second")
        or _num(summary, "QPS w/ loadgen overhead"),
        target_qps=cfg.target_qps,
        latency_bound_ms=cfg.latency_ms if cfg.scenario == "Server" else None,
        latency_ms=latency,
        queries=len(latencies),
        errors=len(errors),
        first_error=errors[0] if errors else None,
        outdir=str(cfg.outdir),
        summary=summary,
    )


def write_outputs(result: BenchResult, latencies: list[float], prometheus: bool = False) -> None:
    """result.json, latency.png and (with ``prometheus``) result.prom in the result's outdir."""
    outdir = Path(result.outdir)
    (outdir / "result.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    plot_latencies(latencies, result, outdir / "latency.png")
    if prometheus:
        write_prometheus(result, outdir / "result.prom")


def plot_latencies(latencies: list[float], result: BenchResult, path: Path) -> None:
    """Latency of every query in issue order, and their distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [1000 * x for x in latencies]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(ms, ".", markersize=2)
    left.set(xlabel="query (completion order)", ylabel="latency (ms)")
    right.hist(ms, bins=60)
    right.set(xlabel="latency (ms)", ylabel="queries")
    if result.latency_bound_ms:
        for ax, line in ((left, left.axhline), (right, right.axvline)):
            line(result.latency_bound_ms, color="red", linestyle="--", label="bound")
            ax.legend()
    rate = result.samples_per_second or result.scheduled_qps
    fig.suptitle(
        f"{result.model} {result.scenario}: {result.result}"
        + (f", {rate:.1f} samples/s" if rate else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_prometheus(result: BenchResult, path: Path) -> None:
    """The result as gauges (Prometheus text format) for a textfile collector."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    labels = {"model": result.model, "scenario": result.scenario}
    names = list(labels)

    def gauge(name: str, doc: str, value: float | None, **extra: str) -> None:
        if value is None:
            return
        g = Gauge(name, doc, [*names, *extra], registry=registry)
        g.labels(**labels, **extra).set(value)

    gauge("gpufleet_loadgen_valid", "1 if LoadGen judged the run VALID.", float(result.valid))
    gauge("gpufleet_loadgen_samples_per_second", "Samples/s (Offline).", result.samples_per_second)
    gauge("gpufleet_loadgen_scheduled_qps", "Scheduled queries/s (Server).", result.scheduled_qps)
    lat = Gauge(
        "gpufleet_loadgen_latency_seconds",
        "Query latency: min, mean, max, pNN.",
        [*names, "stat"],
        registry=registry,
    )
    for stat, value in result.latency_ms.items():
        lat.labels(**labels, stat=stat).set(value / 1000)
    gauge("gpufleet_loadgen_errors", "Failed requests.", float(result.errors))
    write_to_textfile(str(path), registry)
