"""`gpufleet doctor`'s one read of a cluster (cluster/doctor/facts.py) through the real
kubernetes client against an API server on 127.0.0.1 that answers from a table of paths: every
list lands in its Facts field, each probe is a dryRun create, and each refusal is kept as its
one line, which the checks then show instead of guessing. The real API server answers the
same reads in tests/cluster/test_devcluster_doctor.py; here each answer is chosen, a 403 on
every read and a 500 on a probe included, which a real server cannot be made to give."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from kubernetes.client import ApiClient, Configuration

from gpufleet.cluster.doctor import Facts, Status, diagnose, gather
from gpufleet.cluster.doctor.requirements import (
    JOBSET,
    JOBSET_PROBE,
    KUEUE,
    KUEUE_CONFIGMAP,
    KUEUE_PROBE,
    MANAGER_CONFIG_KEY,
    MPI_OPERATOR,
    RDMA_POLICY,
)
from gpufleet.net import free_port

Obj = dict[str, Any]
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
KUEUE_NS, JOBSET_NS = "kueue-system", "jobset-system"
RBAC = 'User "bob" cannot list resource "{0}" at the cluster scope'


class ApiServer:
    """A Kubernetes API server's HTTP answers from ``routes`` (path -> object, or a status
    code answered with a Status body); every request is recorded (method, path, query, body).
    ``refuse``: answer every request with it (403: the RBAC authorizer's words)."""

    def __init__(self, routes: dict[str, Obj | int], refuse: int | None = None) -> None:
        self.routes, self.refuse = routes, refuse
        self.requests: list[tuple[str, str, dict[str, list[str]], Obj | None]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _answer(self, method: str) -> None:
                url = urlsplit(self.path)
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size)) if size else None
                server.requests.append((method, url.path, parse_qs(url.query), body))
                found = server.refuse or server.routes.get(url.path, 404)
                code, obj = (found, _status(found, url.path)) if isinstance(found, int) else (
                    200, found)  # fmt: skip
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        return Handler

    @contextmanager
    def client(self) -> Iterator[ApiClient]:
        thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)
        thread.start()
        try:
            with client_for(self.url) as api:
                yield api
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()


@contextmanager
def client_for(url: str) -> Iterator[ApiClient]:
    config = Configuration()
    config.host = url
    with ApiClient(config) as api:
        yield api


def _status(code: int, path: str) -> Obj:
    plural = path.rstrip("/").rsplit("/", 1)[-1]
    message = {403: f"{plural} is forbidden: " + RBAC.format(plural),
               404: "the server could not find the requested resource",
               500: f"Internal error occurred: failed calling webhook for {plural}: "
                    "connection refused"}[code]  # fmt: skip
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "code": code}  # fmt: skip


def listing(*items: Obj) -> Obj:
    return {"metadata": {}, "items": list(items)}


def crd(name: str, version: str) -> Obj:
    plural, group = name.split(".", 1)
    return {"metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": plural, "kind": plural.title()},
                     "versions": [{"name": version, "served": True, "storage": True}]}}  # fmt: skip


def webhook_config(name: str, client_config: Obj) -> Obj:
    hook = {"name": f"{name}.example", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": client_config}  # fmt: skip
    return {"metadata": {"name": name}, "webhooks": [hook]}


def cluster_routes(kueue_config: str | None) -> dict[str, Obj | int]:
    """Kueue (webhooks answering), JobSet (webhooks failing), the MPI Operator (no probe),
    GPU nodes, DNS, a tenant, the RDMA policy and its binding."""
    crds = [crd(n, v) for c in (KUEUE, JOBSET, MPI_OPERATOR) for n, v in c.crds]
    template = {"selector": {}, "template": {}}
    deploy = {"metadata": {"name": "kueue-controller-manager", "namespace": KUEUE_NS},
              "spec": {**template, "replicas": 1}, "status": {"readyReplicas": 1}}  # fmt: skip
    plugin = {"metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"},
              "spec": template, "status": {"currentNumberScheduled": 1, "numberReady": 1,
                                           "desiredNumberScheduled": 1,
                                           "numberMisscheduled": 0}}  # fmt: skip
    node = {"metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.count": "8"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}  # fmt: skip
    maps = [] if kueue_config is None else [
        {"metadata": {"name": KUEUE_CONFIGMAP, "namespace": KUEUE_NS},
         "data": {MANAGER_CONFIG_KEY: kueue_config}}]  # fmt: skip
    kueue_hook = {"service": {"namespace": KUEUE_NS, "name": "kueue-webhook-service"}}
    jobset_hook = {"service": {"namespace": JOBSET_NS, "name": "jobset-webhook-service"}}
    return {
        "/version/": {"major": "1", "minor": "36", "gitVersion": "v1.36.3", "gitCommit": "abc",
                     "gitTreeState": "clean", "buildDate": "2026-11-01T00:00:00Z",
                     "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"},
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions": listing(*crds),
        "/apis/apps/v1/deployments": listing(deploy),
        "/apis/coordination.k8s.io/v1/leases": listing({"metadata": {"name": "other"}}),
        "/apis/apps/v1/daemonsets": listing(plugin),
        "/api/v1/nodes": listing(node),
        "/api/v1/namespaces": listing({"metadata": {"name": "research"}}),
        "/apis/storage.k8s.io/v1/storageclasses": listing(
            {"metadata": {"name": "fast"}, "provisioner": "local"}),
        "/api/v1/namespaces/kube-system/services": listing(
            {"metadata": {"name": "kube-dns", "namespace": "kube-system"}}),
        "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices": listing(
            {"metadata": {"name": "kube-dns-x"}, "addressType": "IPv4",
             "endpoints": [{"addresses": ["10.0.0.10"], "conditions": {"ready": True}}]}),
        "/api/v1/configmaps": listing(*maps),
        f"{ADMISSION}/validatingwebhookconfigurations": listing(
            webhook_config("kueue", kueue_hook), webhook_config("by-url", {"url": "https://x"})),
        f"{ADMISSION}/mutatingwebhookconfigurations": listing(
            webhook_config("jobset", jobset_hook)),
        f"{ADMISSION}/validatingadmissionpolicies": listing(
            {"metadata": {"name": RDMA_POLICY}, "spec": {"validations": []}}),
        f"{ADMISSION}/validatingadmissionpolicybindings": listing(
            {"metadata": {"name": RDMA_POLICY},
             "spec": {"policyName": RDMA_POLICY, "validationActions": ["Deny"]}}),
        "/apis/kueue.x-k8s.io/v1beta2/resourceflavors": KUEUE_PROBE,  # cluster-scoped
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets": 500,  # its webhook is down
    }  # fmt: skip


def gathered(routes: dict[str, Obj | int]) -> tuple[Facts, ApiServer]:
    server = ApiServer(routes)
    with server.client() as api:
        return gather(api), server


def test_every_list_lands_in_its_field_as_the_apis_camel_case_dicts() -> None:
    facts, _ = gathered(cluster_routes("integrations:\n  frameworks: [batch/job]\n"))
    assert facts.errors == {}
    assert facts.version == "v1.36.3"
    assert sorted(facts.crds) == sorted(n for c in (KUEUE, JOBSET, MPI_OPERATOR) for n, _ in c.crds)
    assert facts.deployments[0]["status"] == {"readyReplicas": 1}  # camelCase, as the API says
    assert [d["metadata"]["name"] for d in facts.daemonsets] == ["nvidia-device-plugin-daemonset"]
    assert facts.nodes[0]["status"]["allocatable"] == {"nvidia.com/gpu": "8"}
    assert [n["metadata"]["name"] for n in facts.namespaces] == ["research"]
    assert [s["metadata"]["name"] for s in facts.storage_classes] == ["fast"]
    assert [s["metadata"]["name"] for s in facts.dns_services] == ["kube-dns"]
    assert facts.dns_endpoints[0]["endpoints"][0]["addresses"] == ["10.0.0.10"]
    assert facts.kueue_config == {"integrations": {"frameworks": ["batch/job"]}}
    # A webhook called by URL names no Service; the two that name one are kept.
    want = {f"{KUEUE_NS}/kueue-webhook-service", f"{JOBSET_NS}/jobset-webhook-service"}
    assert facts.webhook_services == want
    assert facts.rdma_policy is True


def test_probes_are_dry_run_creates_and_a_refused_one_keeps_the_servers_words() -> None:
    facts, server = gathered(cluster_routes(None))
    posts = [(path, query, body) for method, path, query, body in server.requests
             if method == "POST"]  # fmt: skip
    # Kueue's probe is cluster-scoped, JobSet's namespaced; both only dry runs. The MPI
    # Operator (installed, but no webhooks) and absent controllers get none.
    assert posts == [
        ("/apis/kueue.x-k8s.io/v1beta2/resourceflavors", {"dryRun": ["All"]}, KUEUE_PROBE),
        ("/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", {"dryRun": ["All"]},
         JOBSET_PROBE),
    ]  # fmt: skip
    assert facts.probes["kueue-controller-manager"] == ""
    assert facts.probes["jobset-controller-manager"] == (
        "dry-run create of a JobSet: HTTP 500: Internal error occurred: failed calling webhook "
        "for jobsets: connection refused"
    )
    lines = {f.check: f for f in diagnose(facts, [])}
    assert lines["kueue webhooks"].status is Status.OK
    assert lines["jobset webhooks"].status is Status.FAIL
    assert "failed calling webhook" in lines["jobset webhooks"].detail
    assert facts.kueue_config is None  # no ConfigMap: Kueue's defaults


def test_a_kueue_config_that_is_no_mapping_reads_as_empty() -> None:
    facts, _ = gathered(cluster_routes("just a string\n"))
    assert facts.kueue_config == {}
    facts, _ = gathered(cluster_routes(""))
    assert facts.kueue_config == {}


def test_the_dns_selector_and_the_kueue_config_map_are_asked_for_by_name() -> None:
    _, server = gathered(cluster_routes(None))
    asked = {path: query for method, path, query, _ in server.requests if method == "GET"}
    assert asked["/api/v1/namespaces/kube-system/services"] == {
        "labelSelector": ["k8s-app=kube-dns"]
    }
    slices = "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"
    assert asked[slices] == {"labelSelector": ["kubernetes.io/service-name=kube-dns"]}
    assert asked["/api/v1/configmaps"] == {"fieldSelector": [f"metadata.name={KUEUE_CONFIGMAP}"]}


def test_every_refused_read_is_its_one_line_and_each_check_fails_saying_so() -> None:
    server = ApiServer({}, refuse=403)
    with server.client() as api:
        facts = gather(api)
    assert sorted(facts.errors) == sorted([
        "version", "crds", "deployments", "leases", "daemonsets", "nodes", "namespaces",
        "storageclasses", "dns", "kueue-config", "webhooks", "rdma-policy"])  # fmt: skip
    assert facts.errors["nodes"] == (
        'list node: forbidden (RBAC): nodes is forbidden: User "bob" cannot list resource '
        '"nodes" at the cluster scope'
    )
    assert facts.errors["kueue-config"].startswith(
        "list config map for all namespaces ({'field_selector': 'metadata.name="
        f"{KUEUE_CONFIGMAP}'}}): forbidden (RBAC): "
    )
    assert facts.errors["version"].startswith("read the API server's version: forbidden (RBAC)")
    assert (facts.crds, facts.nodes, facts.probes, facts.rdma_policy) == ({}, [], {}, False)
    found = {f.check: f for f in diagnose(facts, [])}
    want = {"kubernetes": "version", "kueue integrations": "kueue-config",
            "kueue CRDs": "crds", "device plugin": "daemonsets", "storage": "storageclasses",
            "pod security": "namespaces", "dns": "dns", "prometheus operator": "crds"}  # fmt: skip
    for check, key in want.items():
        assert (found[check].status, found[check].detail) == (Status.FAIL, facts.errors[key])
        assert "cluster admin" in found[check].fix
    assert "rdma" not in found  # tenants unreadable: whether one uses RDMA is unknown


def test_an_api_server_that_cannot_be_reached_is_said_for_every_read() -> None:
    with client_for(f"http://127.0.0.1:{free_port()}") as api:  # nothing listens there
        facts = gather(api)
    assert len(facts.errors) == 12
    assert all(": cannot reach the API server: " in e for e in facts.errors.values())
    assert facts.errors["nodes"].startswith("list node: cannot reach the API server: ")


def test_doctor_reads_the_yaml_the_kueue_manager_reads() -> None:
    """The ConfigMap's key holds the manager's whole Configuration; doctor reads the same."""
    config = {"integrations": {"frameworks": ["jobset.x-k8s.io/jobset"]},
              "waitForPodsReady": {"timeout": "5m"}}  # fmt: skip
    facts, _ = gathered(cluster_routes(yaml.safe_dump(config)))
    assert facts.kueue_config == config
    line = {f.check: f for f in diagnose(facts, [])}["kueue pods ready"]
    assert line.status is Status.OK and "5m" in line.detail
