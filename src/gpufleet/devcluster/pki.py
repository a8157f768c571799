"""Certificates of the local control plane: one CA, the API server's serving certificate, a
client certificate per component and for the admin, the ServiceAccount token keys, and the
aggregation layer's front-proxy CA and client.

The API server runs as a real one does (client certificates, RBAC, signed ServiceAccount
tokens), so every component authenticates with its own identity (system:kube-scheduler, ...).
ECDSA P-256 keys: fast to make, accepted everywhere here (ES256 ServiceAccount tokens).
"""

from __future__ import annotations

import datetime
import ipaddress
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (file stem, common name, organization): the client identities the control plane uses.
CLIENTS = (
    ("admin", "gpufleet-admin", "system:masters"),
    ("kube-controller-manager", "system:kube-controller-manager", None),
    ("kube-scheduler", "system:kube-scheduler", None),
    ("kwok", "kwok-controller", "system:masters"),
    # the API server's own, to a kubelet (logs, exec, port-forward); kubelets authorize it
    ("kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
)
API_SERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
VALID_FOR = datetime.timedelta(days=365)
FRONT_PROXY_CA = "front-proxy-ca"  # the aggregation layer's CA and client (make_pki)
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class Pki:
    """Where the files are: ``<dir>/<name>.crt`` and ``.key`` for each identity."""

    dir: Path

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def ca(self) -> Path:
        return self.cert("ca")

    @property
    def service_account_key(self) -> Path:
        return self.key("service-account")

    @property
    def service_account_pub(self) -> Path:
        return self.dir / "service-account.pub"

    @property
    def encryption_config(self) -> Path:
        """The API server's EncryptionConfiguration: the key of the Secrets in etcd."""
        return self.dir / "encryption.yaml"


# How the API server writes a Secret to etcd: encrypted with the cluster's own key (NaCl
# secretbox: XSalsa20 and Poly1305, a 32-byte key), each value then starting with
# ``k8s:enc:secretbox:v1:<key name>:``; identity last, so that a value written before
# encryption was on is still read (and encrypted when next written).
ENCRYPTION_KEY_NAME = "cluster-key-1"


def write_encryption_config(pki: Pki) -> Path:
    """The cluster's EncryptionConfiguration, a new random key in it (mode 0600, in the PKI's
    0700 directory); kept if already there, as the certificates are."""
    import base64
    import json
    import secrets

    path = pki.encryption_config
    if path.exists():
        return path
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    doc = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "EncryptionConfiguration",
           "resources": [{"resources": ["secrets"], "providers": [
               {"secretbox": {"keys": [{"name": ENCRYPTION_KEY_NAME, "secret": key}]}},
               {"identity": {}}]}]}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")  # JSON is YAML
    tmp.chmod(0o600)  # as the keys beside it, in the 0700 directory
    tmp.replace(path)
    return path


def write_kubeconfig(path: Path, server: str, pki: Pki, user: str) -> Path:
    """A kubeconfig for ``user`` (a client certificate of the PKI) at ``path``, readable by its
    owner only."""
    import json

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpufleet-local",
                "cluster": {"server": server, "certificate-authority": str(pki.ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki.cert(user)),
                    "client-key": str(pki.key(user)),
                },
            }
        ],
        "contexts": [
            {"name": "gpufleet-local", "context": {"cluster": "gpufleet-local", "user": user}}
        ],
        "current-context": "gpufleet-local",
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")  # JSON is YAML
    path.chmod(0o600)
    return path


def make_pki(directory: Path, server_ips: Sequence[str] = ("127.0.0.1",)) -> Pki:
    """Create every certificate and key under ``directory`` (kept if already there); the API
    server's certificate names ``server_ips``."""
    from cryptography.hazmat.primitives import serialization

    pki = Pki(directory)
    if pki.ca.exists() and pki.service_account_pub.exists() and _names_ips(pki, server_ips):
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    _make_ca(pki, "ca", "gpufleet-local-ca")
    # The aggregation layer's own CA (as kubeadm makes it): the API server proxies to an
    # extension API server (Prometheus Adapter) as front-proxy-client, and that server trusts
    # the user headers only from a certificate of this CA, not from any cluster client.
    _make_ca(pki, FRONT_PROXY_CA, "gpufleet-front-proxy-ca")
    issue(pki, FRONT_PROXY_CLIENT, FRONT_PROXY_CLIENT, ca=FRONT_PROXY_CA)
    issue(pki, "kube-apiserver", "kube-apiserver", server_names=API_SERVER_NAMES, ips=server_ips)
    for name, cn, org in CLIENTS:
        issue(pki, name, cn, [org] if org else [])
    sa_key = _new_key()
    _save_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def _make_ca(pki: Pki, stem: str, cn: str) -> None:
    """A self-signed CA, ``<stem>.crt`` and ``.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    now = datetime.datetime.now(datetime.UTC)
    key = _new_key()
    name = _subject(cn)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _save_key(pki.key(stem), key)
    pki.cert(stem).write_bytes(ca.public_bytes(serialization.Encoding.PEM))


def issue(
    pki: Pki,
    name: str,
    cn: str,
    orgs: Sequence[str] = (),
    *,
    server_names: Sequence[str] = (),
    ips: Sequence[str] = ("127.0.0.1",),
    not_after: datetime.datetime | None = None,
    ca: str = "ca",
) -> Path:
    """Sign ``<name>.crt``/``.key`` with the PKI's CA: a serving certificate for
    ``server_names`` and ``ips`` when names are given, else a client certificate for user ``cn`` in
    groups ``orgs``; valid for a year, or until ``not_after``; signed by CA ``ca`` (its stem).
    Returns the certificate's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    signer = x509.load_pem_x509_certificate(pki.cert(ca).read_bytes())
    ca_key = serialization.load_pem_private_key(pki.key(ca).read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)  # make_pki's
    now = datetime.datetime.now(datetime.UTC)
    key = _new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_subject(cn, *orgs))
        .issuer_name(signer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now, not_after or now) - datetime.timedelta(days=1))
        .not_valid_after(not_after or now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    server = bool(server_names)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    _save_key(pki.key(name), key)
    cert = builder.sign(ca_key, hashes.SHA256())
    pki.cert(name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pki.cert(name)


def _names_ips(pki: Pki, ips: Sequence[str]) -> bool:
    """Whether the API server's certificate names every address of ``ips``."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pki.cert("kube-apiserver").read_bytes())
    except OSError:
        return False
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {str(a) for a in sans.get_values_for_type(x509.IPAddress)}
    made = [pki.cert("kubelet-client"), pki.cert(FRONT_PROXY_CLIENT)]  # by every version now
    return set(ips) <= named and all(p.exists() for p in made)


def _new_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _save_key(path: Path, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _subject(cn: str, *orgs: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    # RFC 5280 bounds a common name at 64 characters and cryptography enforces it, but the
    # API server takes the user name from it and Go's x509 reads longer ones: a ServiceAccount's
    # user name (the Trainer's is 73 characters) must fit whole, so only that check is skipped.
    with warnings.catch_warnings():  # it still warns
        warnings.simplefilter("ignore", UserWarning)
        common_name = x509.NameAttribute(NameOID.COMMON_NAME, cn, _validate=False)
    return x509.Name([*attrs, common_name])
