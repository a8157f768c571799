"""Probe pods on the real nodes: a pod of the project's image, Pod Security restricted as the
renderers make it, that tries connections from its namespace and prints what each one met
(tests/cluster/test_realnodes_attacks.py: the network policies and the servers beside them)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from gpufleet.devcluster.nodes import GPU_TAINT
from gpufleet.devcluster.realnodes.network import netns_name
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from tests.support.devcluster import CLUSTER_POLL_S, DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT, pod_log, project_image

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
GPU_NODES = {**GPU_TAINT, "operator": "Exists"}  # every real node is a GPU node
# What a connection met: a peer that accepted it; one that refused it (a reset: nothing
# listens, or a firewall's REJECT); silence on every attempt (a firewall's DROP).
OPEN, REFUSED, SILENT = "open", "refused", "silent"

# What a probe pod runs: for each (host, port) what it met (OPEN ends the attempts at once);
# with "fetch", each URL's HTTP status over TLS without a client certificate or token (or what
# failed); with "scrape", the metrics body's gpufleet_ lines; with "resolve", each name's
# address or "". The attempts run side by side.
PROBE = """
import json, socket, ssl, sys, time, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
want = json.loads(sys.argv[1])
def attempt(target):
    host, port = target
    met = "silent"
    for _ in range(3):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return "open"
        except ConnectionRefusedError:
            met = "refused"
        except OSError:
            pass
        time.sleep(1)
    return met
def fetch(url):
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read()[:300].decode(errors='replace')}"
    except OSError as exc:
        return f"error {exc}"
with ThreadPoolExecutor(16) as pool:
    connect = list(pool.map(attempt, want.get("connect", [])))
    fetched = list(pool.map(fetch, want.get("fetch", [])))
out = {f"{h}:{p}": met for (h, p), met in zip(want.get("connect", []), connect)}
out |= dict(zip(want.get("fetch", []), fetched))
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
    renderers make it, the project's image, no ServiceAccount token); its verdicts."""
    container = {
        "name": "probe", "image": project_image()[0], "imagePullPolicy": "Never",
        "command": ["python", "-c", PROBE, json.dumps(want)],
        "securityContext": CONTAINER_SECURITY,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "500m", "memory": "256Mi"}},
    }  # fmt: skip
    pod = {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "containers": [container], "tolerations": [GPU_NODES],
        "securityContext": POD_SECURITY, "automountServiceAccountToken": False,
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
