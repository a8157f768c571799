"""gpufleet.observe.tls in this process: the certificate options (given together or not at
all, each bad file named), and a /metrics server over TLS: a client that trusts the CA is
served, plain HTTP and (with a client CA) a client without a certificate are turned away, and
one silent connection holds no other request up. The command-line servers run the same code in
their own processes: tests/integration/test_metrics_tls.py and test_serving_tls.py."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpufleet.devcluster.pki import Pki
from gpufleet.errors import UserInputError
from gpufleet.observe.http import start_metrics_server
from gpufleet.observe.tls import TlsFiles, checked_context, cli_files
from tests.support.tls import tls_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return tls_pki(tmp_path_factory.mktemp("pki"))


def error_of(call: object) -> tuple[str, str]:
    with pytest.raises(UserInputError) as info:
        call()  # type: ignore[operator]
    (error,) = info.value.errors
    return error.path, error.message


def test_the_options_go_together(pki: Pki) -> None:
    cert, key, ca = str(pki.cert("server")), str(pki.key("server")), str(pki.ca)
    assert cli_files(None, None, None) is None
    assert cli_files(cert, key, None) == TlsFiles(cert, key)
    assert cli_files(cert, key, ca) == TlsFiles(cert, key, ca)
    assert error_of(lambda: cli_files(cert, None, None)) == ("--tls-key", "needed with --tls-cert")
    assert error_of(lambda: cli_files(None, key, None)) == ("--tls-cert", "needed with --tls-key")
    assert error_of(lambda: cli_files(None, None, ca))[0] == "--tls-client-ca"


def test_each_bad_file_is_named_by_its_option(pki: Pki, tmp_path: Path) -> None:
    cert, key = str(pki.cert("server")), str(pki.key("server"))
    assert error_of(lambda: checked_context(TlsFiles(str(tmp_path / "no"), key)))[0] == "--tls-cert"
    other_key = str(pki.key("client"))
    path, said = error_of(lambda: checked_context(TlsFiles(cert, other_key)))
    assert path == "--tls-cert" and "cannot serve TLS" in said
    junk = tmp_path / "ca.crt"
    junk.write_text("not a certificate")
    path, said = error_of(lambda: checked_context(TlsFiles(cert, key, str(junk))))
    assert path == "--tls-client-ca" and "not a PEM CA certificate" in said
    mutual = checked_context(TlsFiles(cert, key, str(pki.ca)))
    assert mutual.verify_mode == ssl.CERT_REQUIRED
    assert mutual.minimum_version == ssl.TLSVersion.TLSv1_2


def fetch(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return str(resp.read().decode())


def turned_away(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        fetch(url, context)
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        cause = getattr(exc, "reason", exc)
        return not isinstance(cause, ConnectionRefusedError)
    return False


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual"])
def test_a_metrics_server_over_tls(pki: Pki, mutual: bool) -> None:
    registry = CollectorRegistry()
    Counter("tls_test_total", "a series", registry=registry).inc()
    files = TlsFiles(str(pki.cert("server")), str(pki.key("server")),
                     str(pki.ca) if mutual else None)  # fmt: skip
    server, _ = start_metrics_server(registry, "127.0.0.1", 0, "t", checked_context(files))
    url = f"https://localhost:{server.server_port}/metrics"
    client = ssl.create_default_context(cafile=str(pki.ca))
    if mutual:
        assert turned_away(url, client)  # no certificate of the CA's
        client.load_cert_chain(str(pki.cert("client")), str(pki.key("client")))
    try:
        silent = socket.create_connection(("127.0.0.1", server.server_port))
        assert "tls_test_total 1.0" in fetch(url, client)  # while one says nothing
        silent.close()
        assert turned_away(f"http://localhost:{server.server_port}/metrics")
        assert turned_away(url, ssl.create_default_context())  # the system's CAs only
    finally:
        server.shutdown()
        server.server_close()
