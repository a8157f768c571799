"""HTTPS on gpufleet's /metrics servers (issue 55 item 3): a real Prometheus (the Debian
package) scrapes the GPU exporter with mutual TLS and a running job's metrics over HTTPS
(spec.metrics.tls, its certificate in a local Secret), each checked against the test CA; a
plain-HTTP client is refused by both, a client without a certificate by the exporter. Bad
certificate options are one error naming the option, and exit 2."""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.pki import Pki
from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.net import free_port
from tests.support.cli import cli_env, gpufleet_cmd, run_cli
from tests.support.procs import poll_until, stop_processes
from tests.support.prometheus import prometheus, query, static
from tests.support.scrape import served_port
from tests.support.specs import digits_job, write_spec
from tests.support.tls import tls_pki

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (make tools)"
    ),
]

SERVER_NAME = "metrics.gpufleet.test"  # the certificate's name, which scrapers check


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a serving certificate for SERVER_NAME and 127.0.0.1, and a client certificate."""
    return tls_pki(tmp_path_factory.mktemp("pki"), SERVER_NAME)


def get(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return str(resp.read().decode())


def client(pki: Pki, *, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        context.load_cert_chain(str(pki.cert("client")), str(pki.key("client")))
    return context


def refused(call: Callable[[], Any]) -> bool:
    """Whether the server turned the call away at once: a TLS error or a dropped connection,
    not a refused connection (nothing listening) nor a timeout."""
    started = time.monotonic()
    try:
        call()
    except (OSError, http.client.HTTPException) as exc:  # ssl.SSLError is an OSError
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        turned_away = (ssl.SSLError, ConnectionResetError, http.client.HTTPException)
        return isinstance(cause, turned_away) and time.monotonic() - started < 8
    return False


def tls(pki: Pki, *, with_cert: bool) -> dict[str, Any]:
    """A Prometheus scrape job's HTTPS settings: the test CA, the certificate's name."""
    config = {"ca_file": str(pki.ca), "server_name": SERVER_NAME}
    if with_cert:
        config |= {"cert_file": str(pki.cert("client")), "key_file": str(pki.key("client"))}
    return {"scheme": "https", "tls_config": config}


def test_prometheus_scrapes_the_exporter_with_mutual_tls_and_a_job_over_https(
    workdir: Path, pki: Pki
) -> None:
    secret = workdir / ".gpufleet" / "secrets" / "metrics-tls"  # a kubernetes.io/tls Secret
    secret.mkdir(parents=True)
    shutil.copy(pki.cert("server"), secret / "tls.crt")
    shutil.copy(pki.key("server"), secret / "tls.key")
    exporter = subprocess.Popen(
        gpufleet_cmd("exporter", "--simulate", "2", "--port", "0", "--tls-cert",
                     str(pki.cert("server")), "--tls-key", str(pki.key("server")),
                     "--tls-client-ca", str(pki.ca)),
        cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    procs = [exporter]
    try:
        exp_port, job_port = served_port(exporter), free_port()
        metrics = {"port": job_port, "tls": {"secretName": "metrics-tls"}}
        doc = digits_job("tlsjob", workload={"name": "digits", "steps": 20000, "logEvery": 10},
                         checkpoint={"everySteps": 1000, "keep": 1}, metrics=metrics)  # fmt: skip
        procs.append(subprocess.Popen(gpufleet_cmd("run", str(write_spec(workdir, doc))),
                                      cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))  # fmt: skip
        scrapes = [
            static("gpufleet-exporter", f"127.0.0.1:{exp_port}", **tls(pki, with_cert=True)),
            static("gpufleet-job", f"127.0.0.1:{job_port}", **tls(pki, with_cert=False)),
        ]
        with prometheus(workdir, scrapes) as prom:
            poll_until(lambda: len(query(prom, "gpufleet_gpu_up == 1")) == 2, what="GPU series",
                       timeout=60, interval=0.5, retry_on=(OSError,))  # fmt: skip
            step = 'gpufleet_job_step{job_name="tlsjob"} > 0'
            poll_until(lambda: query(prom, step), what="the job's step", timeout=90,
                       interval=0.5, retry_on=(OSError,))  # fmt: skip
            targets = {t["metric"]["job"]: t["value"][1] for t in query(prom, "up")}
            assert targets == {"gpufleet-exporter": "1", "gpufleet-job": "1"}
        exporter_url, job_url = (f"https://127.0.0.1:{p}/metrics" for p in (exp_port, job_port))
        assert "gpufleet_gpu_up" in get(exporter_url, client(pki, with_cert=True))
        assert "gpufleet_job_step" in get(job_url, client(pki, with_cert=False))
        assert refused(lambda: get(exporter_url, client(pki, with_cert=False)))  # mutual TLS
        for port in (exp_port, job_port):  # plain HTTP: the handshake fails, nothing is served
            assert refused(lambda p=port: get(f"http://127.0.0.1:{p}/metrics"))
        silent = socket.create_connection(("127.0.0.1", job_port))  # connects, says nothing
        try:  # its handshake waits in its own thread: others are served meanwhile
            assert "gpufleet_job_step" in get(job_url, client(pki, with_cert=False))
        finally:
            silent.close()
        other = ssl.create_default_context()  # the system's CAs: the test CA is not among them
        assert refused(lambda: get(job_url, other))
    finally:
        stop_processes(procs)


def test_certificate_options_that_cannot_work_are_one_error_and_exit_2(
    workdir: Path, pki: Pki
) -> None:
    cert, key = str(pki.cert("server")), str(pki.key("server"))
    cases = {
        ("--tls-cert", cert): "--tls-key: needed with --tls-cert",
        ("--tls-cert", cert, "--tls-key", str(pki.key("client"))): "cannot serve TLS",
        ("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", "/nope"): "--tls-client-ca",
        ("--tls-client-ca", str(pki.ca)): "needs --tls-cert and --tls-key",
    }
    for args, said in cases.items():
        proc = run_cli("exporter", "--simulate", "1", "--port", "0", *args, cwd=workdir)
        assert proc.returncode == EXIT_BAD_INPUT, (args, proc.stderr)
        assert said in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith("error: 1 error"), proc.stderr  # the project's format
