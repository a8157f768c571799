"""Certificates for the TLS tests: a CA, a serving certificate and a client certificate, made
with gpufleet's own PKI code (gpufleet.devcluster.pki), ECDSA, in a fresh directory."""

from __future__ import annotations

from pathlib import Path

from gpufleet.devcluster.pki import Pki, issue, make_pki


def tls_pki(directory: Path, server_name: str = "localhost") -> Pki:
    """A CA; ``pki.cert("server")``, a serving certificate for ``server_name`` and 127.0.0.1;
    ``pki.cert("client")``, a client certificate the CA signed (mutual TLS)."""
    pki = make_pki(directory)
    issue(pki, "server", "gpufleet-server", server_names=[server_name])
    issue(pki, "client", "gpufleet-client")
    return pki
