"""The local control plane's certificates (gpufleet.devcluster.pki): who signs what, for which
use, and the aggregation layer's CA apart from the cluster's."""

from __future__ import annotations

import base64
import ipaddress
import os
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.devcluster.components import kube_apiserver
from gpufleet.devcluster.pki import (
    CLIENTS,
    FRONT_PROXY_CA,
    FRONT_PROXY_CLIENT,
    make_pki,
    write_encryption_config,
)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_every_certificate_is_signed_by_the_ca_for_its_use(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    ca = load(pki.ca)
    server = load(pki.cert("kube-apiserver"))
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    for name, cn, org in CLIENTS:
        cert = load(pki.cert(name))
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == cn
        orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        assert orgs == ([org] if org else [])
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert (pki.key(name).stat().st_mode & 0o777) == 0o600
    again = make_pki(tmp_path / "pki")  # kept, not regenerated
    assert load(again.ca) == ca


def test_the_front_proxy_has_a_ca_of_its_own(tmp_path: Path) -> None:
    """An extension API server trusts the user headers only from the API server's front-proxy
    client: that certificate is of a second CA, so no cluster client can pass for it."""
    from cryptography.exceptions import InvalidSignature

    pki = make_pki(tmp_path / "pki")
    argv = kube_apiserver(Path("kube-apiserver"), pki, 6443, 2379).argv
    assert f"--requestheader-client-ca-file={pki.cert(FRONT_PROXY_CA)}" in argv
    assert f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}" in argv
    client = load(pki.cert(FRONT_PROXY_CLIENT))
    client.verify_directly_issued_by(load(pki.cert(FRONT_PROXY_CA)))
    with pytest.raises((InvalidSignature, ValueError)):
        client.verify_directly_issued_by(load(pki.ca))
    for name, _, _ in CLIENTS:
        with pytest.raises((InvalidSignature, ValueError)):
            load(pki.cert(name)).verify_directly_issued_by(load(pki.cert(FRONT_PROXY_CA)))


def test_the_secrets_key_is_the_clusters_own_private_and_kept(tmp_path: Path) -> None:
    """Issue 55, item 1: a random 32-byte secretbox key per cluster, readable by its owner
    only whatever the umask, kept on the next `cluster up` (etcd's data was written with it);
    an interrupted write's file is replaced."""
    pki = make_pki(tmp_path / "pki")
    pki.encryption_config.with_suffix(".tmp").write_text("half")
    old = os.umask(0)
    try:
        path = write_encryption_config(pki)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600 and not path.with_suffix(".tmp").exists()
    (provider, identity) = yaml.safe_load(path.read_text())["resources"][0]["providers"]
    (key,) = provider["secretbox"]["keys"]
    assert len(base64.b64decode(key["secret"])) == 32 and identity == {"identity": {}}
    assert write_encryption_config(pki).read_text() == path.read_text()  # kept
    other = make_pki(tmp_path / "other")
    assert write_encryption_config(other).read_text() != path.read_text()  # per cluster
    argv = kube_apiserver(Path("kube-apiserver"), pki, 6443, 2379).argv
    assert f"--encryption-provider-config={path}" in argv
