"""One /metrics endpoint for all of a node's workers (prometheus_client multiprocess mode).

Workers write their series into files in a directory; this server reads the whole directory on
each scrape. It runs in the process that outlives worker restarts: ``gpufleet run`` locally, the
pod launcher (``gpufleet.launch.pod``) in a pod.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufleet.errors import MetricsPortError


@contextmanager
def serve_metrics_dir(directory: Path, address: str, port: int) -> Iterator[int]:
    """Empty ``directory``, then serve what workers write there on ``address:port`` until the
    block ends; yields the port (useful with port 0)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    try:
        server, _ = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise MetricsPortError(f"cannot serve metrics on {address}:{port}: {exc}") from exc
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
