"""`gpufleet serve --tls-cert --tls-key --tls-client-ca` (issue 55 item 3): the served digits
model over mutual TLS, through real clients: tritonclient over HTTPS (the guard terminates it)
and over gRPC with TLS (Triton's own --grpc-use-ssl-mutual), and MLPerf LoadGen over each.
A plain-text client, and a TLS client without a certificate, are refused."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpufleet.devcluster.pki import Pki
from tests.support.oip import MODEL
from tests.support.tls import tls_pki
from tests.support.triton import Served, cli_serve

pytestmark = pytest.mark.slow
tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("pytriton")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, the server's certificate (localhost, 127.0.0.1) and a client's."""
    return tls_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_served(
    served: Served, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[str], list[str]]]:
    """The served model's repository again, by `gpufleet serve` with mutual TLS: its ports
    (HTTP, gRPC, metrics) and its output up to the ready line."""
    repo = served.endpoints.models[0].directory.parent
    args = ("--tls-cert", str(pki.cert("server")), "--tls-key", str(pki.key("server")),
            "--tls-client-ca", str(pki.ca))  # fmt: skip
    with cli_serve(repo, tmp_path_factory.mktemp("tls"), *args) as (proc, ports, lines):
        assert proc.poll() is None, lines
        yield ports, lines


def expected(served: Served, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with torch.no_grad():
        return served.model(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def client_files(pki: Pki) -> dict[str, str]:
    return {"ca": str(pki.ca), "cert": str(pki.cert("client")), "key": str(pki.key("client"))}


def test_tritonclient_infers_over_https_and_grpc_with_tls(
    served: Served, pki: Pki, tls_served: tuple[list[str], list[str]]
) -> None:
    (http_port, grpc_port, _), lines = tls_served
    assert any(f"HTTP https://127.0.0.1:{http_port}" in line for line in lines), lines
    f = client_files(pki)
    x = served.images[:16]
    https = tritonclient_http.InferenceServerClient(
        f"127.0.0.1:{http_port}", ssl=True,
        ssl_options={"ca_certs": f["ca"], "certfile": f["cert"], "keyfile": f["key"]},
    )  # fmt: skip
    grpcs = tritonclient_grpc.InferenceServerClient(
        f"127.0.0.1:{grpc_port}", ssl=True, root_certificates=f["ca"], private_key=f["key"],
        certificate_chain=f["cert"],
    )  # fmt: skip
    try:
        for lib, client in ((tritonclient_http, https), (tritonclient_grpc, grpcs)):
            inp = lib.InferInput("INPUT__0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            got = client.infer(MODEL, [inp]).as_numpy("OUTPUT__0")
            np.testing.assert_allclose(got, expected(served, x), rtol=1e-5, atol=1e-5)
    finally:
        https.close()
        grpcs.close()


def refused(call: Any) -> bool:
    """Whether the server turned the call away at once (a TLS failure, a dropped connection;
    gRPC's UNAVAILABLE), not a refused connection (nothing listening) nor a timeout."""
    started = time.monotonic()
    try:
        call()
    except Exception as exc:  # urllib's, tritonclient's and gRPC's own errors: each its own kind
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return not isinstance(cause, ConnectionRefusedError) and time.monotonic() - started < 8
    return False


def test_plain_text_and_clients_without_a_certificate_are_refused(
    pki: Pki, tls_served: tuple[list[str], list[str]]
) -> None:
    (http_port, grpc_port, _), _ = tls_served
    ready = f"127.0.0.1:{http_port}/v2/models/{MODEL}/ready"
    assert refused(lambda: urllib.request.urlopen(f"http://{ready}", timeout=10))
    no_cert = ssl.create_default_context(cafile=str(pki.ca))
    assert refused(lambda: urllib.request.urlopen(f"https://{ready}", timeout=10, context=no_cert))
    with_cert = ssl.create_default_context(cafile=str(pki.ca))
    with_cert.load_cert_chain(str(pki.cert("client")), str(pki.key("client")))
    with urllib.request.urlopen(f"https://{ready}", timeout=10, context=with_cert) as resp:
        assert resp.status == 200  # the same request, with the client's certificate
    plain = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    assert refused(lambda: plain.get_model_metadata(MODEL, client_timeout=10))
    plain.close()
    anonymous = tritonclient_grpc.InferenceServerClient(
        f"127.0.0.1:{grpc_port}", ssl=True, root_certificates=str(pki.ca)
    )
    assert refused(lambda: anonymous.get_model_metadata(MODEL, client_timeout=10))
    anonymous.close()
    f = client_files(pki)  # and the same server answers a client with its certificate
    member = tritonclient_grpc.InferenceServerClient(
        f"127.0.0.1:{grpc_port}", ssl=True, root_certificates=f["ca"], private_key=f["key"],
        certificate_chain=f["cert"])  # fmt: skip
    assert member.get_model_metadata(MODEL, client_timeout=10).name == MODEL
    member.close()


@pytest.mark.parametrize("scheme", ["grpc", "https"])
def test_loadgen_over_mutual_tls_is_valid(
    pki: Pki, tls_served: tuple[list[str], list[str]], tmp_path: Path, scheme: str
) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    (http_port, grpc_port, _), _ = tls_served
    url = f"127.0.0.1:{grpc_port}" if scheme == "grpc" else f"https://127.0.0.1:{http_port}"
    f = client_files(pki)
    out = tmp_path / "loadgen"
    result = CliRunner().invoke(app, [
        "bench", "inference", "--url", url, "--model", MODEL, "--quick", "--scenario",
        "Offline", "--outdir", str(out), "--tls-ca", f["ca"], "--tls-cert", f["cert"],
        "--tls-key", f["key"], "-o", "json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((out / "result.json").read_text())
    assert data["result"] == "VALID" and data["samples_per_second"] > 0, data
