"""What one LoadGen run is asked (BenchConfig, with every default of `gpufleet bench
inference`) and what it reports (BenchResult)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import FieldError

SCENARIOS = ("SingleStream", "Server", "Offline")


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
    # TLS to the server: the CA that signed its certificate; for mutual TLS also this client's
    # certificate and key (PEM files). None: plain, unless the URL is https://.
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

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
        return errors + self._tls_errors()

    def _tls_errors(self) -> list[FieldError]:
        given = {"--tls-ca": self.tls_ca, "--tls-cert": self.tls_cert, "--tls-key": self.tls_key}
        errors = [FieldError(o, f"{p}: no such file") for o, p in given.items()
                  if p is not None and not p.is_file()]  # fmt: skip
        if (self.tls_cert is None) != (self.tls_key is None):
            errors.append(FieldError("--tls-cert/--tls-key", "give both, or neither"))
        elif self.tls_cert is not None and self.tls_ca is None:
            errors.append(FieldError("--tls-ca", "needed with a client certificate"))
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
    min_duration_met: bool | None = None  # LoadGen's "Min duration satisfied" (None: unread)
    summary: dict[str, str] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("summary")
        return out
