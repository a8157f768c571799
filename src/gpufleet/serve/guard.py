"""The HTTP front of ``gpufleet serve``: requests are bounded before Triton sees them.

Triton 2.51 (in PyTriton 0.7) has no limit on an HTTP body, on a gzip body's expanded size, or
on the element count a request's ``shape`` claims; one request of ``"shape": [64, 1, 8,
1099511627776]`` made tritonserver die. Its HTTP listener is therefore private (127.0.0.1, a
free port) and this proxy is the public one. Per request it:

- refuses a body without Content-Length (411) or larger than ``max_body`` (413), unread;
- expands a ``Content-Encoding: gzip`` or ``deflate`` body itself, at most ``max_body`` bytes
  out (413 beyond), and forwards it plain; another encoding is 415;
- for ``POST /v2/models/<m>[/versions/<v>]/infer``, reads the JSON header (all of the body, or
  the first ``Inference-Header-Content-Length`` bytes with the binary extension) and refuses
  (400) any input whose shape is not non-negative integers, claims more elements than its
  model's config allows (``max(max_batch_size, 1)`` times the config's dims, where fixed), or
  more elements than the request has bytes (every element takes at least one);
- answers ``/v2/health/ready`` itself: 200 only while Triton is ready and every model READY
  (Triton said ready before the models were loaded), else 503.

Errors are the Open Inference Protocol's ``{"error": "..."}``. Everything else (bodies Triton
parses itself, other APIs, the restricted ones and their token) passes through unchanged, so
Triton's own answers stay the reference. gRPC goes to Triton directly: docs/security.md.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpufleet.observe.http import check_listen
from gpufleet.observe.tls import handshake
from gpufleet.serve.repository import ModelEntry

# Bytes a JSON element may take at most in a legitimate request ("-1.2345678e-05, "), for the
# default body bound; the header's own size is covered by the floor.
_JSON_BYTES_PER_ELEMENT = 24
_MIN_MAX_BODY = 1 << 20
_UNBOUNDED_MAX_BODY = 64 << 20  # a model with variable dims: Triton's later default
# A body above the bound but at most this large is read (1 MiB at a time, never kept) before
# the 413, as clients that send all of a body before reading the answer would otherwise see a
# broken pipe instead of it; larger ones are answered at once and the connection closed.
_DRAIN_MAX = 128 << 20
# A connection closed with a body left unread (a chunked one, one too large to drain) is closed
# lingering, as nginx's lingering_close: the answer sent, writing shut, what the client still
# sends read and dropped for up to this long. Closed at once, the unread bytes make the kernel
# reset the connection, and the client's next write fails (EPIPE) before it reads the answer.
_LINGER_S = 2.0
_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
               "trailer", "transfer-encoding", "upgrade", "content-length", "host"}  # fmt: skip


def element_bound(entry: ModelEntry, dims: tuple[int, ...]) -> int | None:
    """Most elements one input of ``entry`` may hold in a request (None: a variable dim)."""
    if any(d < 0 for d in dims):
        return None
    return max(entry.batching.max_batch_size, 1) * math.prod(dims)


def default_max_body(entries: list[ModelEntry]) -> int:
    """A body bound that every legitimate request of these models fits in: the largest
    request's elements as JSON text, at least 1 MiB; 64 MiB with a variable dim."""
    total = 0
    for entry in entries:
        bounds = [element_bound(entry, t.dims) for t in entry.inputs]
        if any(b is None for b in bounds):
            return _UNBOUNDED_MAX_BODY
        total = max(total, sum(b or 0 for b in bounds))
    return max(_MIN_MAX_BODY, total * _JSON_BYTES_PER_ELEMENT)


@dataclass(frozen=True)
class Limits:
    """What the guard allows."""

    max_body: int  # bytes of a request body, after decompression too
    elements: dict[str, dict[str, int | None]]  # model -> input -> most elements

    @classmethod
    def for_models(cls, entries: list[ModelEntry], max_body: int | None = None) -> Limits:
        return cls(
            max_body=max_body or default_max_body(entries),
            elements={
                e.name: {t.name: element_bound(e, t.dims) for t in e.inputs} for e in entries
            },
        )


class Refused(Exception):
    """A request the guard answers itself: its status and the OIP error message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_infer_header(header: Any, model: str, limits: Limits, body_bytes: int) -> None:
    """Refuse an infer request whose inputs claim too many elements; leave everything else
    (malformed members included) to Triton's own parser."""
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        return
    bounds = limits.elements.get(model, {})
    for item in header["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("shape"), list):
            continue
        name, shape = item.get("name"), item["shape"]
        if not all(type(d) is int and d >= 0 for d in shape):
            raise Refused(400, f"input {str(name)!r}: shape must be non-negative integers, "
                               f"got {json.dumps(shape)[:80]}")  # fmt: skip
        count = math.prod(shape)
        largest = max(shape, default=0)
        bound = bounds.get(name) if isinstance(name, str) else None
        if bound is not None and max(count, largest) > bound:
            raise Refused(400, f"input {name!r}: shape {shape} has {count} elements; model "
                               f"{model} takes at most {bound} per request")  # fmt: skip
        if max(count, largest) > body_bytes:
            raise Refused(400, f"input {str(name)!r}: shape {shape} claims {count} elements, "
                               f"more than the request's {body_bytes} bytes can hold")  # fmt: skip


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise Refused(400, f"the {encoding} body is not valid: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise Refused(413, f"the {encoding} body expands to more than {limit} bytes")
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients (tritonclient, LoadGen) reuse them
    timeout = 120  # seconds a client may stall mid-request (or idle between requests)
    server: GuardServer
    # One kept-alive connection to Triton per client connection, closed with it.
    upstream_conn: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: with Nagle's algorithm the second waits
        # for the client's delayed ACK (40 ms a request, measured); answers must not wait.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.upstream_conn is not None:
                self.upstream_conn.close()

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: Triton keeps its own."""

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/v2/health/ready":
            self._ready()
        else:
            self._forward(None)

    def do_POST(self) -> None:
        try:
            body = self._body()
            match = _INFER.match(self.path.split("?", 1)[0])
            if match and body:
                self._check_infer(match.group(1), body)
        except Refused as exc:
            self._answer(exc.status, {"error": str(exc)})
            return
        self._forward(body)

    do_PUT = do_DELETE = do_POST
    do_HEAD = do_OPTIONS = do_GET

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise Refused(411, "a request body needs a Content-Length")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        limit = self.server.limits.max_body
        if length < 0 or length > limit:
            if 0 < length <= _DRAIN_MAX:  # read and dropped, so the client reads the answer
                for start in range(0, length, 1 << 20):
                    self.rfile.read(min(1 << 20, length - start))
            else:
                self.close_connection = True  # left unread
            status = 413 if length > limit else 400
            raise Refused(
                status, f"the request body is {length} bytes; at most {limit} are allowed"
            )
        body = self.rfile.read(length)
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        if encoding in ("gzip", "deflate"):
            body = _inflate(body, encoding, limit)
        elif encoding not in ("", "identity"):
            raise Refused(415, f"Content-Encoding {encoding!r} is not supported: use gzip, "
                               "deflate or none")  # fmt: skip
        del self.headers["Content-Encoding"]  # forwarded plain
        return body

    def _check_infer(self, model: str, body: bytes) -> None:
        header_length = self.headers.get("Inference-Header-Content-Length")
        try:
            size = int(header_length) if header_length is not None else len(body)
        except ValueError:
            return  # Triton answers a malformed header length itself
        try:
            header = json.loads(body[: max(size, 0)])
        except (ValueError, RecursionError):
            return  # not JSON: Triton's parser answers (its documented 500)
        check_infer_header(header, model, self.server.limits, len(body))

    def _ready(self) -> None:
        problem = self.server.not_ready(self)
        if problem:
            self._answer(503, {"error": problem})
        else:
            self._answer(200, None)

    def _forward(self, body: bytes | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            status, reason, out_headers, payload = self.server.upstream(
                self, self.command, self.path, body, headers
            )
        except OSError as exc:
            self._answer(502, {"error": f"Triton did not answer: {exc}"})
            return
        self.send_response(status, reason)
        for key, value in out_headers:
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _answer(self, status: int, data: dict[str, Any] | None) -> None:
        payload = json.dumps(data).encode() if data is not None else b""
        self.send_response(status)
        if data is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)


class GuardServer(ThreadingHTTPServer):
    """The proxy: ``limits`` checked, everything else sent to Triton's private HTTP port."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        triton_port: int,
        limits: Limits,
        models: Iterable[str],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.triton_port = triton_port
        self.limits = limits
        self.models = list(models)
        self.tls = tls  # HTTPS only (gpufleet.observe.tls); the handshake in the request's thread
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[Any, Any]:
        conn, peer = self.socket.accept()
        if self.tls is None:
            return conn, peer
        return self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), peer

    def finish_request(self, request: Any, client_address: Any) -> None:
        if handshake(request):
            super().finish_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        """Close lingering (_LINGER_S): socketserver's own shuts writing and closes at once."""
        try:
            request.shutdown(socket.SHUT_WR)
            request.settimeout(_LINGER_S)
            deadline = time.monotonic() + _LINGER_S
            while time.monotonic() < deadline and request.recv(1 << 16):
                pass
        except OSError:
            pass
        self.close_request(request)

    def upstream(
        self,
        handler: _Handler,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """One request to Triton over the handler's kept-alive connection (a new one if Triton
        closed the old one)."""
        for attempt in (0, 1):
            conn = handler.upstream_conn
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.triton_port, timeout=300)
                conn.connect()
                assert conn.sock is not None
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                handler.upstream_conn = conn
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.reason, resp.getheaders(), resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                handler.upstream_conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def not_ready(self, handler: _Handler) -> str | None:
        """Why the server is not ready (None: Triton ready and every model READY)."""
        for path, what in [("/v2/health/ready", "Triton is not ready"),
                           *((f"/v2/models/{m}/ready", f"model {m} is not ready")
                             for m in self.models)]:  # fmt: skip
            try:
                status = self.upstream(handler, "GET", path, None, {})[0]
            except OSError as exc:
                return f"Triton did not answer: {exc}"
            if status != 200:
                return what
        return None


def start_guard(
    address: str,
    port: int,
    triton_port: int,
    limits: Limits,
    models: Iterable[str],
    tls: ssl.SSLContext | None = None,
) -> tuple[GuardServer, threading.Thread]:
    """Serve the guard on ``address:port`` in a daemon thread, HTTPS only with ``tls``
    (OSError if it cannot listen)."""
    family, host = check_listen(address, port)  # the metrics servers' resolution, IPv6 too

    class Server(GuardServer):
        address_family = family

    server = Server((host, port), triton_port, limits, models, tls)
    thread = threading.Thread(target=server.serve_forever, name="serve-guard", daemon=True)
    thread.start()
    return server, thread
