"""Probe pods on the real nodes: a pod of the project's image, Pod Security restricted as the
renderers make it, that tries connections from its namespace and prints what each one met
(tests/cluster/test_realnodes_attacks.py: the network policies and the servers beside them)."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from gpufleet.devcluster.nodes import GPU_TAINT
from gpufleet.devcluster.realnodes.network import netns_name
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from tests.support.devcluster import CLUSTER_POLL_S, DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import pod_log, project_image

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
GPU_NODES = {**GPU_TAINT, "operator": "Exists"}  # every real node is a GPU node
# What a connection met: a peer that accepted it; one that refused it (a reset: nothing
# listens, or a firewall's REJECT); silence on every attempt (a firewall's DROP).
OPEN, REFUSED, SILENT = "open", "refused", "silent"

# What a probe pod runs: for each (host, port) what it met (OPEN ends the attempts at once);
# with "fetch", each URL's HTTP status over TLS without a client certificate or token (or what
# failed); with "scrape", the metrics body's gpufleet_ lines; with "resolve", each name's
# address or "". The attempts run side by side; with "rounds", all of it again each second,
# each round a line that starts with its time ("at").
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
def measure():
    out = {"at": time.time()}
    with ThreadPoolExecutor(16) as pool:
        connect = list(pool.map(attempt, want.get("connect", [])))
        fetched = list(pool.map(fetch, want.get("fetch", [])))
    out |= {f"{h}:{p}": met for (h, p), met in zip(want.get("connect", []), connect)}
    out |= dict(zip(want.get("fetch", []), fetched))
    if want.get("scrape"):
        body = urllib.request.urlopen(want["scrape"], timeout=5).read().decode()
        out["scraped"] = [l for l in body.splitlines() if l.startswith("gpufleet_")]
    for name in want.get("resolve", []):
        try:
            out[name] = socket.gethostbyname(name)
        except OSError:
            out[name] = ""
    print(json.dumps(out), flush=True)
for _ in range(want.get("rounds", 1)):
    measure()
    time.sleep(1)
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
    start(cluster, where, name, want)
    try:
        poll_until(lambda: phase(cluster, where, name) in ("Succeeded", "Failed"),
                   what=f"probe {where}/{name}", timeout=180, interval=CLUSTER_POLL_S)  # fmt: skip
        said = pod_log(cluster, name, namespace=where)
        assert phase(cluster, where, name) == "Succeeded", said
        return dict(json.loads(said.strip().splitlines()[-1]))
    finally:
        cluster.core.delete_namespaced_pod(name, where, grace_period_seconds=0)


def probe_once_enforced(
    cluster: DevCluster, where: str, name: str, want: dict[str, Any]
) -> dict[str, Any]:
    """The probe's verdicts from its first round after its own egress policies are in place
    (kube-router installs a new pod's rules a moment after it starts: a round before them
    would measure no policy at all)."""
    start(cluster, where, name, {**want, "rounds": 90})
    try:
        pod = poll_until(lambda: running(cluster, where, name), what=f"probe {where}/{name}",
                         timeout=180, interval=CLUSTER_POLL_S)  # fmt: skip
        poll_until(lambda: enforced_for(cluster, pod, "from"), what=f"{name}'s policies",
                   timeout=60)  # fmt: skip
        since = time.time()

        def after() -> dict[str, Any] | None:
            lines = pod_log(cluster, name, namespace=where).strip().splitlines()
            rounds = [json.loads(line) for line in lines if line.startswith("{")]
            return next((dict(r) for r in rounds if r["at"] > since), None)

        return poll_until(after, what=f"a round of {name} after its policies", timeout=60)
    finally:
        cluster.core.delete_namespaced_pod(name, where, grace_period_seconds=0)


def start(cluster: DevCluster, where: str, name: str, want: dict[str, Any]) -> None:
    """The probe pod, created."""
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

    def created() -> bool | None:
        """Kueue's pod webhook (mpod.kb.io) reads namespaces from its informer's cache: a
        namespace created a moment ago may not be there yet (404 "Namespace ... not found")."""
        from kubernetes.client.exceptions import ApiException

        try:
            cluster.core.create_namespaced_pod(where, pod)
        except ApiException as e:
            said = str(e.body)
            if e.status == 404 and "Namespace" in said and where in said and "not found" in said:
                return None
            raise
        return True

    poll_until(created, what=f"the probe pod created in {where}", timeout=30, interval=0.5)


def running(cluster: DevCluster, where: str, name: str) -> dict[str, Any] | None:
    """The pod, once Running (as a dict, as the API returns it)."""
    pod = cluster.as_dict(cluster.core.read_namespaced_pod(name, where))
    return dict(pod) if pod["status"].get("phase") == "Running" else None


def phase(cluster: DevCluster, where: str, name: str) -> str:
    return str(cluster.core.read_namespaced_pod(name, where).status.phase)


def enforced_for(cluster: DevCluster, pod: dict[str, Any], way: str = "destined to") -> bool:
    """Whether kube-router on the pod's node has the pod's own firewall rules for traffic
    ``way`` ("destined to" it, its ingress; "from" it, its egress): its policies are in place
    from then on."""
    rules = subprocess.run(["ip", "netns", "exec", netns_name(pod["spec"]["nodeName"]),
                            "iptables-save", "-t", "filter"], capture_output=True, text=True,
                           check=False).stdout  # fmt: skip
    meta = pod["metadata"]
    return f"{way} POD name:{meta['name']} namespace: {meta['namespace']}" in rules
