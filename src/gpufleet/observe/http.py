"""The HTTP server of every /metrics endpoint gpufleet runs (the GPU exporter, job metrics).

prometheus_client's own server answers the metrics on every path (its documented backwards
compatibility) and 405 to HEAD. This one keeps its exposition (``make_wsgi_app``: content
negotiation, gzip) and its threading WSGI server, and routes as node_exporter does: /metrics
the metrics, / a small landing page, anything else 404; HEAD is answered like GET, without a
body. Bad addresses and ports, and failures to bind, are MetricsPortError (one line, exit 2).
With a TLS context it serves HTTPS only (gpufleet.observe.tls).
"""

from __future__ import annotations

import errno
import html
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from gpufleet.errors import MetricsPortError

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr: a scrape every 15 s would drown the command's output."""


def _error(option: str, message: str) -> MetricsPortError:
    exc = MetricsPortError(message)
    exc.option = option  # the command-line option to blame (the exporter's)
    return exc


def url_host(address: str) -> str:
    """``address`` as the host part of a URL: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address else address


def url(address: str, port: int, path: str = "/metrics", *, tls: bool = False) -> str:
    """``http://address:port/path`` (``https`` with ``tls``), an IPv6 address in brackets."""
    return f"{'https' if tls else 'http'}://{url_host(address)}:{port}{path}"


def check_listen(address: str, port: int) -> tuple[int, str]:
    """The socket family and address to listen on; MetricsPortError naming the option when the
    port is out of range or the address is neither an IP address nor a resolvable name."""
    if not 0 <= port <= 65535:
        raise _error("--port", f"must be 0..65535, got {port}")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        # Digits and dots or colons that are no address (999.1.1.1) would go to a resolver.
        if not address or any(c.isspace() for c in address) or set(address) <= set("0123456789.:"):
            raise _error("--address", f"not an IP address or host name: {address!r}") from None
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise _error("--address", f"cannot listen on {address!r}: {exc}") from None
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


def metrics_app(registry: CollectorRegistry, title: str) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: /metrics, a landing page at /, 404 elsewhere; HEAD like GET, no body."""
    metrics = make_wsgi_app(registry)
    page = (
        f"<html><head><title>{html.escape(title)}</title></head><body><h1>"
        f'{html.escape(title)}</h1><p><a href="/metrics">Metrics</a></p></body></html>\n'
    ).encode()

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method not in ("GET", "HEAD", "OPTIONS"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD, OPTIONS")])
            return [b"405 method not allowed: use GET or HEAD\n"]
        if path == "/metrics":
            if method != "HEAD":
                return metrics(environ, start_response)  # type: ignore[no-any-return]
            got: list[Any] = []  # HEAD: GET's status and headers with its length, no body
            body = b"".join(metrics({**environ, "REQUEST_METHOD": "GET"}, lambda *a: got.extend(a)))
            start_response(got[0], [*got[1], ("Content-Length", str(len(body)))])
            return []
        if path == "/" and method != "OPTIONS":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                      ("Content-Length", str(len(page)))])  # fmt: skip
            return [] if method == "HEAD" else [page]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [] if method == "HEAD" else [b"404 not found: metrics are at /metrics\n"]

    return app


def start_metrics_server(
    registry: CollectorRegistry,
    address: str,
    port: int,
    title: str,
    tls: ssl.SSLContext | None = None,
) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """Serve ``registry`` on ``address:port`` (0: any free port) in a daemon thread; HTTPS
    only with a ``tls`` context."""
    from gpufleet.observe.tls import handshake

    family, host = check_listen(address, port)

    class Server(ThreadingWSGIServer):
        address_family = family

        def get_request(self) -> tuple[Any, Any]:
            conn, peer = self.socket.accept()
            if tls is None:
                return conn, peer
            return tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), peer

        def finish_request(self, request: Any, client_address: Any) -> None:
            if handshake(request):  # in the connection's own thread
                super().finish_request(request, client_address)

    try:
        httpd = make_server(host, port, metrics_app(registry, title), Server, _QuietHandler)
    except OSError as exc:
        option = "--address" if exc.errno == errno.EADDRNOTAVAIL else "--port"
        where = url(address, port, "")
        raise _error(option, f"cannot listen on {where}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
