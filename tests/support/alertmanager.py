"""A real Alertmanager (Debian's package, scripts/get-alertmanager.sh) on 127.0.0.1,
and a loopback HTTP receiver that keeps what is posted to it (Slack, Mattermost, webhooks) and
can serve a fixed metrics page (a recorded Triton page)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet.net import free_port
from tests.support.procs import poll_until, stop_processes

# Debian names the server prometheus-alertmanager; upstream's build, alertmanager.
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
needs_alertmanager = pytest.mark.skipif(
    ALERTMANAGER is None or AMTOOL is None,
    reason="alertmanager/amtool not installed (make tools: scripts/get-alertmanager.sh)",
)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert AMTOOL
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


@contextmanager
def alertmanager(directory: Path, config: Path) -> Iterator[int]:
    """Alertmanager with ``config`` on 127.0.0.1, clustering off (no gossip port on 0.0.0.0);
    yields its port."""
    assert ALERTMANAGER
    port = free_port()
    log = directory / "alertmanager.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [ALERTMANAGER, f"--config.file={config}", f"--storage.path={directory / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            cwd=directory, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # Ready before Prometheus sends: an alert it could not deliver is resent only after a
        # minute. A server that died (its port taken meanwhile) fails here, with its log.
        ready = f"http://127.0.0.1:{port}/-/ready"
        try:
            poll_until(lambda: _answers(ready), what="Alertmanager ready", timeout=60,
                       alive=proc, retry_on=(OSError,))  # fmt: skip
        except pytest.fail.Exception as e:
            pytest.fail(f"{e}\n{log.read_text(errors='replace')[-3000:]}")
        yield port
    finally:
        stop_processes([proc])


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)


@dataclass
class Post:
    path: str
    authorization: str | None
    body: dict[str, Any]


class Receiver:
    """Keeps every JSON POST; answers GET /metrics with ``metrics()`` (text exposition)."""

    def __init__(self, metrics: Any = None) -> None:
        self.posts: list[Post] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the stdlib's method name
                size = int(self.headers.get("Content-Length", "0"))
                post = Post(self.path, self.headers.get("Authorization"),
                            json.loads(self.rfile.read(size)))  # fmt: skip
                with receiver.lock:
                    receiver.posts.append(post)
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                body = metrics() if metrics and self.path == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path: str) -> list[Post]:
        with self.lock:
            return [p for p in self.posts if p.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
