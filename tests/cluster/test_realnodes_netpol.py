"""The chart's network policies, enforced on the real nodes (issue 29, item 4): kube-router's
firewall runs on every node (`cluster up --real-nodes`), and each promise is a real connection
attempt from a pod to a running job's pod 0 of tenant A (research): its rendezvous port (the
c10d store) and its metrics port.

- tenant B's pod (product) reaches neither; nor does a pod of a namespace without policies (A's
  own ingress policy refuses it, whatever the source allows);
- A's own pod reaches both, and resolves pod 0's name and the API server's through DNS;
- a pod of the monitoring namespace scrapes A's metrics port (the ranks' Prometheus metrics).

The job's own pods on two nodes rendezvous and train under the same policies (every other
real-node test too: the chart is installed with them)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from gpufleet.devcluster.nodes import GPU_TAINT
from gpufleet.devcluster.realnodes.network import netns_name
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY, RDZV_PORT
from gpufleet.runtime.metrics import STEP
from tests.support.devcluster import CLUSTER_POLL_S, DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import (
    TENANT,
    pod_log,
    project_image,
    real_job,
    running_pod,
    submit,
)

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(600)]  # fmt: skip

OTHER_TENANT = "product"
MONITORING = "monitoring"  # the chart's networkPolicy.monitoringNamespace
OUTSIDE = "netpol-outside"  # no network policy at all
METRICS_PORT = 9411
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
GPU_NODES = {**GPU_TAINT, "operator": "Exists"}  # every real node is a GPU node

# What a probe pod runs: for each (host, port) its verdict, "open" or "closed"; "open" ends the
# attempts at once, "closed" is a refusal or silence on every attempt; with "scrape", the
# metrics body's gpufleet_ lines; with "resolve", each name's address or "".
PROBE = """
import json, socket, sys, time, urllib.request
want = json.loads(sys.argv[1])
def attempt(host, port):
    for _ in range(3):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return "open"
        except OSError:
            time.sleep(1)
    return "closed"
out = {f"{host}:{port}": attempt(host, port) for host, port in want["connect"]}
if want.get("scrape"):
    body = urllib.request.urlopen(want["scrape"], timeout=5).read().decode()
    out["scraped"] = [l for l in body.splitlines() if l.startswith("gpufleet_")]
for name in want.get("resolve", []):
    try:
        out[name] = socket.gethostbyname(name)
    except OSError:
        out[name] = ""
print(json.dumps(out))
"""


def namespace(cluster: DevCluster, name: str) -> None:
    """Namespace ``name`` under Pod Security restricted, made if missing."""
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.create_namespace({"metadata": {"name": name, "labels": RESTRICTED}})
    except ApiException as exc:
        assert exc.status == 409, exc


def probe(cluster: DevCluster, where: str, name: str, want: dict[str, Any]) -> dict[str, Any]:
    """Run the probe in a pod ``name`` of namespace ``where`` (Pod Security restricted as the
    renderers make it, the project's image); its verdicts."""
    container = {
        "name": "probe", "image": project_image()[0], "imagePullPolicy": "Never",
        "command": ["python", "-c", PROBE, json.dumps(want)],
        "securityContext": CONTAINER_SECURITY,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "500m", "memory": "256Mi"}},
    }  # fmt: skip
    pod = {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "containers": [container], "tolerations": [GPU_NODES],
        "securityContext": POD_SECURITY,
    }}  # fmt: skip
    cluster.core.create_namespaced_pod(where, pod)
    try:
        poll_until(lambda: phase(cluster, where, name) in ("Succeeded", "Failed"),
                   what=f"probe {where}/{name}", timeout=180, interval=CLUSTER_POLL_S)  # fmt: skip
        said = pod_log(cluster, name, namespace=where)
        assert phase(cluster, where, name) == "Succeeded", said
        return dict(json.loads(said.strip().splitlines()[-1]))
    finally:
        cluster.core.delete_namespaced_pod(name, where, grace_period_seconds=0)


def phase(cluster: DevCluster, where: str, name: str) -> str:
    return str(cluster.core.read_namespaced_pod(name, where).status.phase)


def enforced_for(cluster: DevCluster, pod: dict[str, Any]) -> bool:
    """Whether kube-router on the pod's node has the pod's own firewall chain (its policies
    are in place from then on)."""
    rules = subprocess.run(["ip", "netns", "exec", netns_name(pod["spec"]["nodeName"]),
                            "iptables-save", "-t", "filter"], capture_output=True, text=True,
                           check=False).stdout  # fmt: skip
    name = pod["metadata"]["name"]
    return f"destined to POD name:{name} namespace: {TENANT}" in rules


def test_tenants_are_isolated_monitoring_scrapes_and_dns_answers(reallab: DevCluster) -> None:
    name = "netpol"
    doc = real_job(name, 2, 1)
    doc["spec"]["workload"] = {"name": "digits", "steps": 100000, "logEvery": 100}
    doc["spec"]["checkpoint"]["everySteps"] = 1000
    doc["spec"]["metrics"] = {"port": METRICS_PORT}
    submit(reallab, doc)
    try:
        poll_until(lambda: all(running_pod(reallab, name, i) for i in (0, 1)),
                   what="both pods running", timeout=300)  # fmt: skip
        pod_0 = running_pod(reallab, name, 0)
        assert pod_0 is not None
        poll_until(lambda: "step " in pod_log(reallab, pod_0["metadata"]["name"]),
                   what="a step: the two pods rendezvoused", timeout=300,
                   interval=CLUSTER_POLL_S)  # fmt: skip
        poll_until(lambda: enforced_for(reallab, pod_0), what="pod 0's policies", timeout=60)
        address = pod_0["status"]["podIP"]
        ports = [[address, RDZV_PORT], [address, METRICS_PORT]]
        for where in (OUTSIDE, MONITORING):
            namespace(reallab, where)

        for where in (OTHER_TENANT, OUTSIDE):
            seen = probe(reallab, where, "intruder", {"connect": ports})
            assert set(seen.values()) == {"closed"}, (where, seen)

        pod_0_name = f"{name}-0.{name}.{TENANT}.svc.cluster.local"
        api = "kubernetes.default.svc.cluster.local"
        seen = probe(reallab, TENANT, "peer", {"connect": ports, "resolve": [pod_0_name, api]})
        assert seen[f"{address}:{RDZV_PORT}"] == seen[f"{address}:{METRICS_PORT}"] == "open", seen
        assert seen[pod_0_name] == address, seen
        assert seen[api], seen

        scrape = f"http://{address}:{METRICS_PORT}/metrics"
        seen = probe(reallab, MONITORING, "scraper", {"connect": ports[1:], "scrape": scrape})
        assert any(line.startswith(STEP) for line in seen["scraped"]), seen
    finally:
        assert reallab.cancel(name, TENANT)
