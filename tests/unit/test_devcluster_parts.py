"""The local control plane's pure parts: its PKI and the fake GPU nodes it creates."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.devcluster.cluster import NodeSpec, node_object
from gpufleet.devcluster.components import KWOK_NODE_ANNOTATION, kube_apiserver
from gpufleet.devcluster.pki import CLIENTS, make_pki
from tests.conftest import REPO


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


def test_gpu_nodes_carry_capacity_discovery_labels_taint_and_kwok_annotation() -> None:
    node = node_object("n0", NodeSpec(gpus=4, gpu_product="NVIDIA-H100-80GB-HBM3"), 0)
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    key, value = KWOK_NODE_ANNOTATION
    assert node["metadata"]["annotations"] == {key: value}
    cpu_only = node_object("c0", NodeSpec(gpus=0), 1)
    assert "nvidia.com/gpu" not in cpu_only["status"]["capacity"] and not cpu_only["spec"]["taints"]


def test_the_api_server_listens_on_loopback_only_and_secured(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    argv = kube_apiserver(Path("kube-apiserver"), pki, 6443, 2379).argv
    assert "--bind-address=127.0.0.1" in argv
    assert "--authorization-mode=Node,RBAC" in argv
    assert f"--client-ca-file={pki.ca}" in argv
    assert "--allow-privileged=false" in argv
    assert not any(a.startswith(("--insecure", "--anonymous-auth=true")) for a in argv)


def test_down_never_signals_a_process_that_is_not_ours(tmp_path: Path) -> None:
    """A pid in state.json whose component died long ago may belong to another program now
    (here: this test's own interpreter): down skips it and status reports the component gone."""
    import os

    from gpufleet.devcluster.cluster import LocalCluster, State

    State(pids={"etcd": os.getpid()}, ports={"etcd": 1}, server="https://127.0.0.1:1",
          binaries=str(tmp_path / "bin")).write(tmp_path)  # fmt: skip
    cluster = LocalCluster(tmp_path, log=lambda _: None)
    assert cluster.status()["etcd"].startswith("exited")
    assert cluster.down() == []  # and this process is still here to assert it
    assert State.read(tmp_path) is None
    (tmp_path / "state.json").write_text("{not json")
    assert State.read(tmp_path) is None and cluster.status() == {}


def test_node_pools_follow_the_charts_flavors_and_topology() -> None:
    """`cluster up --values ci/onprem-50node-values.yaml`: a pool per flavor whose nodes carry
    the flavor's nodeLabels (Kueue's ResourceFlavors select by them), GPUs only on GPU flavors
    (product from the flavor's label), and a value for each Kueue topology level."""
    import yaml

    from gpufleet.devcluster.cluster import pools_from_values

    values = yaml.safe_load(
        (REPO / "deploy/helm/gpufleet/ci/onprem-50node-values.yaml").read_text()
    )
    cpu, h100 = pools_from_values(values, count=2, gpus=8, gpu_product="NVIDIA-A30")
    assert (cpu.prefix, cpu.gpus, h100.prefix, h100.gpus) == ("cpu-node", 0, "h100-node", 8)
    node = node_object("h100-node-1", h100, 1)
    labels = node["metadata"]["labels"]
    assert labels["gpufleet.dev/pool"] == "gpu"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["topology.gpufleet.dev/rack"] == "rack-1"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    cpu_node = node_object("cpu-node-0", cpu, 0)
    assert cpu_node["metadata"]["labels"]["gpufleet.dev/pool"] == "cpu"
    assert "nvidia.com/gpu" not in cpu_node["status"]["capacity"]
    for flavor in values["flavors"]:  # every flavor's nodeLabels select its pool's nodes
        pool = {"cpu": cpu_node, "h100": node}[flavor["name"]]
        assert flavor["nodeLabels"].items() <= pool["metadata"]["labels"].items()
