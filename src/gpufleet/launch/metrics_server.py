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
from ssl import SSLContext
from typing import Any


@contextmanager
def serve_metrics_dir(
    directory: Path,
    address: str,
    port: int,
    extra: tuple[Any, ...] = (),
    tls: SSLContext | None = None,
) -> Iterator[int]:
    """Empty ``directory``, then serve what workers write there, and the ``extra`` collectors
    of this process, on ``address:port`` (HTTPS with ``tls``) until the block ends; yields the
    port (useful with port 0). MetricsPortError if it cannot listen."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from gpufleet.observe.http import start_metrics_server

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    for collector in extra:
        registry.register(collector)
    server, _ = start_metrics_server(registry, address, port, "gpufleet job metrics", tls)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
