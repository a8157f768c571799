"""What one ``gpufleet bench coordinated`` run is asked. Its LoadGen settings default to
LoadGen's own (serve.loadgen.settings.BenchConfig, their one home); the CLI's options and the
worker's arguments read them from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import FieldError, UserInputError
from gpufleet.serve.loadgen.settings import BenchConfig

LOADGEN_DEFAULTS = BenchConfig(url="", model="")


@dataclass(frozen=True, kw_only=True)
class CoordinatedConfig:
    """Every node's LoadGen run: node i queries ``urls[i]`` (cycling when there are more
    nodes than URLs); ``nodes`` None is one node per URL."""

    urls: tuple[str, ...]
    model: str
    scenario: str = LOADGEN_DEFAULTS.scenario
    target_qps: float | None = LOADGEN_DEFAULTS.target_qps  # per node
    latency_ms: float = LOADGEN_DEFAULTS.latency_ms
    duration: float = LOADGEN_DEFAULTS.duration  # per node
    nodes: int | None = None
    quick: bool = False
    outdir: Path = Path("bench-results/coordinated")

    @classmethod
    def parse(
        cls,
        *,
        urls: str,
        model: str,
        scenario: str,
        target_qps: float | None,
        latency_ms: float,
        duration: float,
        nodes: int | None,
        quick: bool,
        outdir: Path,
    ) -> CoordinatedConfig:
        """The config of the CLI's options (URLs comma-separated); UserInputError with what
        is wrong, named by option."""
        endpoints = tuple(u.strip() for u in urls.split(",") if u.strip())
        if not endpoints:
            raise UserInputError([FieldError("--urls", "give at least one endpoint")])
        config = cls(
            urls=endpoints,
            model=model,
            scenario=scenario,
            target_qps=target_qps,
            latency_ms=latency_ms,
            duration=duration,
            nodes=nodes,
            quick=quick,
            outdir=outdir,
        )
        errors = config.loadgen(endpoints[0]).errors()
        if errors:
            raise UserInputError(errors)
        return config

    def node_count(self) -> int:
        """How many nodes run LoadGen."""
        return self.nodes or len(self.urls)

    def loadgen(self, url: str) -> BenchConfig:
        """One node's LoadGen settings, against ``url``."""
        return BenchConfig(
            url=url,
            model=self.model,
            scenario=self.scenario,
            target_qps=self.target_qps,
            latency_ms=self.latency_ms,
            duration=self.duration,
            quick=self.quick,
        )
