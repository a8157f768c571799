"""TLS for gpufleet's /metrics servers (issue 55 item 3): the GPU exporter's and the job
metrics', from a certificate and its key in PEM files (a Secret of type kubernetes.io/tls,
mounted: ``tls.crt``, ``tls.key``), and, for mutual TLS, a CA whose client certificates alone
are served. The standard library's ``ssl`` (OpenSSL) does the TLS; TLS 1.2 at least.

The handshake runs in each connection's own thread (``handshake``), not in the server's accept
loop: a client that connects and says nothing, or speaks plain HTTP, costs only its own thread
(dropped when a read waits HANDSHAKE_TIMEOUT), never stalling the requests of others.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.errors import FieldError, UserInputError

# A kubernetes.io/tls Secret's keys, as mounted (one file each); CA_FILE: the CA that signed
# tls.crt, as cert-manager writes it, which a PodMonitor's tlsConfig trusts.
CERT_FILE, KEY_FILE, CA_FILE = "tls.crt", "tls.key", "ca.crt"
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection has to finish its handshake


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate and key, and the CA of the clients it serves (None: any)."""

    cert: str
    key: str
    client_ca: str | None = None

    @classmethod
    def in_dir(cls, directory: str | Path) -> TlsFiles:
        """The certificate and key of a mounted kubernetes.io/tls Secret."""
        return cls(str(Path(directory) / CERT_FILE), str(Path(directory) / KEY_FILE))

    def context(self) -> ssl.SSLContext:
        """A server context (ssl.SSLError, OSError: the files cannot be used)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def checked_context(
    files: TlsFiles, options: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-client-ca")
) -> ssl.SSLContext:
    """``files``' server context, or UserInputError naming the option (or field) to blame:
    a file missing or unreadable, not PEM, or a key that is not the certificate's."""
    for option, path in zip(options, (files.cert, files.key, files.client_ca), strict=True):
        if path is not None and not Path(path).is_file():
            raise UserInputError([FieldError(option, f"{path}: no such file")])
    try:
        if files.client_ca is not None:  # its own error: a CA that is not PEM
            ssl.create_default_context(cafile=files.client_ca)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise UserInputError([FieldError(options[2], f"{files.client_ca}: not a PEM CA "
                                         f"certificate ({reason})")]) from None  # fmt: skip
    try:
        return files.context()
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise UserInputError([FieldError(options[0], f"{files.cert} and {files.key}: cannot "
                                         f"serve TLS with them ({reason})")]) from None  # fmt: skip


def cli_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    """The files of the ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca`` options (None:
    plain HTTP); UserInputError when one is given without the other it needs."""
    if cert is None and key is None:
        if client_ca is not None:
            raise UserInputError([FieldError("--tls-client-ca", "needs --tls-cert and --tls-key")])
        return None
    if cert is None or key is None:
        missing = "--tls-key" if key is None else "--tls-cert"
        given = "--tls-cert" if key is None else "--tls-key"
        raise UserInputError([FieldError(missing, f"needed with {given}")])
    return TlsFiles(cert, key, client_ca)


def handshake(request: Any) -> bool:
    """Finish a wrapped connection's handshake in its own thread; False (the connection
    closed) when the client does not speak TLS, or has no certificate the server accepts."""
    if not isinstance(request, ssl.SSLSocket):
        return True
    request.settimeout(HANDSHAKE_TIMEOUT)
    try:
        request.do_handshake()
    except (ssl.SSLError, OSError):
        request.close()
        return False
    request.settimeout(None)
    return True
