"""The chart's network policies for what is no pod of the cluster: DNS servers, an API server
and a Prometheus outside the pods are let in (or out) only when named, by CIDR."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster.platform import (
    EXAMPLE_VALUES,
    SIMULATED_GPUS,
    helm_command,
    platform_values,
    write_values,
)
from gpufleet.devcluster.realnodes.network import HOST_IP
from tests.support.chart import CHART, helm, needs_helm

pytestmark = needs_helm
SYSTEM, EXPORTER = "gpufleet-system", ("DaemonSet", "exporter")


def component(selector_or_meta: dict[str, Any]) -> str | None:
    """The app.kubernetes.io/component label of a pod selector's matchLabels or of metadata."""
    labels = selector_or_meta.get("matchLabels", selector_or_meta.get("labels")) or {}
    return labels.get("app.kubernetes.io/component")


def lab_objects(sets: list[str]) -> list[dict[str, Any]]:
    """The chart rendered with the lab's values and ``sets``."""
    proc = helm("template", "gpufleet", str(CHART), "-n", SYSTEM,
                "-f", str(CHART / "ci" / "lab-3node-a30-values.yaml"), *sets)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def test_a_prometheus_outside_the_pods_scrapes_only_when_named() -> None:
    """networkPolicy.monitoringCIDRs: a Prometheus that is no pod of the monitoring namespace (a
    host's, as on the real-node cluster) may scrape tenant pods and the exporter; unnamed, only
    the monitoring namespace may. The exporter takes extra options (simulated GPUs)."""
    sets = ["--set", "networkPolicy.monitoringCIDRs={10.250.0.1/32}",
            "--set", "monitoring.exporter.extraArgs={--simulate=4}"]  # fmt: skip
    for given, named in ((sets, True), ([], False)):
        docs = lab_objects(given)
        policies = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
                    for o in docs if o["kind"] == "NetworkPolicy"}  # fmt: skip
        scrapers = [policies[(t, "allow-monitoring-scrape")] for t in ("research", "product")]
        scrapers += [p for (ns, _), p in policies.items()
                     if (ns, component(p["podSelector"])) == (SYSTEM, "exporter")]  # fmt: skip
        assert len(scrapers) == 3
        for policy in scrapers:
            (rule,) = policy["ingress"]
            blocks = [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p]
            assert blocks == (["10.250.0.1/32"] if named else []), policy
            assert any("namespaceSelector" in p for p in rule["from"])
        (exporter,) = [o for o in docs if (o["kind"], component(o["metadata"])) == EXPORTER]
        command = exporter["spec"]["template"]["spec"]["containers"][0]["command"]
        assert ("--simulate=4" in command) == named, command


def test_dns_and_api_server_outside_the_pods_are_opened_only_when_named() -> None:
    """DNS servers and an API server that are no pods (a node-local cache, a control plane's
    hosts) get their own ipBlocks: egress to port 53, ingress from the API server's pod proxy
    (`gpufleet status`); unnamed, no policy opens anything to an address."""
    sets = ["--set", "networkPolicy.dnsCIDRs={10.9.0.10/32}",
            "--set", "networkPolicy.apiServerCIDRs={10.0.0.0/28,10.0.1.5/32}"]  # fmt: skip
    for given, named in ((sets, True), ([], False)):
        policies = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
                    for o in lab_objects(given)
                    if o["kind"] == "NetworkPolicy"}  # fmt: skip
        for tenant in ("research", "product"):
            (dns,) = policies[(tenant, "allow-dns")]["egress"]
            blocks = [p["ipBlock"]["cidr"] for p in dns["to"] if "ipBlock" in p]
            assert blocks == (["10.9.0.10/32"] if named else []), dns
            assert {p["port"] for p in dns["ports"]} == {53}, dns
            proxy = policies.get((tenant, "allow-api-server-proxy"))
            if named:
                assert proxy is not None and proxy["policyTypes"] == ["Ingress"], proxy
                (rule,) = proxy["ingress"]
                assert [p["ipBlock"]["cidr"] for p in rule["from"]] == [
                    "10.0.0.0/28",
                    "10.0.1.5/32",
                ]
            else:
                assert proxy is None, proxy


def test_the_values_cluster_up_writes_run_the_exporter_on_real_nodes(tmp_path: Path) -> None:
    """`gpufleet cluster up --real-nodes` writes the values its cluster needs (issue 51): the
    exporter from the imported image, never pulled, simulating GPUs, with no NVIDIA runtime, no
    kubelet pod-resources socket and no CPU request; the policies open to the host's bridge
    address. Without the project's image the exporter is off; kwok's nodes need none of it."""
    image = "localhost/gpufleet:cpu-0123456789ab"  # its build: the nodes also name it ...:cpu
    written = write_values(tmp_path, platform_values(
        real_nodes=True, images=["registry.k8s.io/pause:3.10", image], volcano=True))  # fmt: skip
    assert helm_command(written).endswith(f"-f {EXAMPLE_VALUES} -f {written} --wait")
    assert f"-f /v.yaml -f {written}" in helm_command(written, Path("/v.yaml"))
    docs = lab_objects(["-f", str(written)])
    (exporter,) = [o for o in docs if (o["kind"], component(o["metadata"])) == EXPORTER]
    pod = exporter["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == ("localhost/gpufleet:cpu", "Never")
    assert f"--simulate={SIMULATED_GPUS}" in container["command"] and "runtimeClassName" not in pod
    assert not pod.get("volumes") and container["resources"]["requests"]["cpu"] == 0
    policies = [o["spec"] for o in docs if o["kind"] == "NetworkPolicy"]
    host = [p for p in policies if f"{HOST_IP}/32" in json.dumps(p)]
    assert len(host) >= 3 and any(o["kind"] == "Queue" for o in docs)  # Volcano's, per tenant
    bare = write_values(tmp_path, platform_values(real_nodes=True, images=[], volcano=False))
    docs = lab_objects(["-f", str(bare)])
    assert not [o for o in docs if (o["kind"], component(o["metadata"])) == EXPORTER]
    kwok = platform_values(real_nodes=False, images=[image], volcano=True)
    assert kwok == {"volcano": {"enabled": True}}
