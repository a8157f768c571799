"""The real-node cluster's metrics pipeline (``cluster up --real-nodes N --metrics-pipeline``),
what a HorizontalPodAutoscaler on a custom metric needs: Prometheus scraping every pod's port
named ``metrics`` (as the chart's PodMonitors select them), and Prometheus Adapter, built from
its module, serving ``custom.metrics.k8s.io`` from it with the rules the InferenceService
renderer names (deploy/prometheus/adapter-rules.yaml).

Both run on the host, as the control plane does. Prometheus reaches the pods through routes to
the nodes' pod ranges on the host's bridge (they go with the bridge at ``down``); its packets
come from the host's bridge address, which the lab's network policies already admit as the API
server's (``networkPolicy.apiServerCIDRs``). The API server reaches the adapter through the
aggregation layer (front-proxy CA, pki.py) on 127.0.0.1, named by an ExternalName Service, the
adapter's serving certificate of the cluster's CA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster.addons.base import LOOPBACK
from gpufleet.devcluster.api import wait
from gpufleet.devcluster.build import REPO
from gpufleet.devcluster.components import Component, _get
from gpufleet.devcluster.nodes import NodeContext
from gpufleet.devcluster.pki import issue
from gpufleet.devcluster.processes import Processes
from gpufleet.devcluster.realnodes import network
from gpufleet.errors import ClusterUpError
from gpufleet.kube import Obj
from gpufleet.net import free_ports

# Built from their modules (scripts/build-controlplane.sh): Prometheus with Kubernetes service
# discovery (Debian's package has none), the adapter.
PROMETHEUS, ADAPTER = "prometheus", "prometheus-adapter"  # components, executables, ports
BINARIES = (PROMETHEUS, ADAPTER)
ADAPTER_RULES_FILE = REPO / "deploy" / "prometheus" / "adapter-rules.yaml"
ALERT_RULES_FILE = REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml"  # the chart's too
SCRAPE_INTERVAL = "5s"  # a load's effect reaches the autoscaler within seconds
RELIST_INTERVAL = "5s"  # how soon the adapter serves the series of a new pod
# The rules' rate window here: four scrapes. The file's own, one minute, suits the 15-30 s
# scrape intervals of real clusters; here it would keep a finished load in the mean queue time
# for a minute before a scale-down could start.
RULES_WINDOW, LOCAL_WINDOW = "[1m]", "[20s]"
PROMETHEUS_USER = "gpufleet:prometheus"
PROMETHEUS_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
ADAPTER_USER = "gpufleet:prometheus-adapter"
# What the adapter reads to map series to objects (its documented RBAC), besides delegating
# authentication and authorization to the API server.
ADAPTER_RULES = [{"apiGroups": [""], "resources": ["nodes", "namespaces", "pods", "services"],
                  "verbs": ["get", "list", "watch"]}]  # fmt: skip
ADAPTER_NAMESPACE, ADAPTER_SERVICE = "kube-system", "prometheus-adapter"
# The custom metrics API's versions the adapter serves (the HPA controller takes the newest).
CUSTOM_METRICS_VERSIONS = ("v1beta1", "v1beta2")
CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
RBAC = "rbac.authorization.k8s.io"


def objects(adapter_port: int, ca_pem: bytes) -> list[Obj]:
    """The two users' RBAC, the adapter's Service on the host, its APIServices
    (the adapter's serving certificate is of the cluster's CA, ``ca_pem``)."""
    from gpufleet.devcluster.realnodes.kind import _binding, _role

    reader = {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
              "metadata": {"name": ADAPTER_USER, "namespace": "kube-system"},
              "roleRef": {"apiGroup": RBAC, "kind": "Role",
                          "name": "extension-apiserver-authentication-reader"},
              "subjects": [{"apiGroup": RBAC, "kind": "User", "name": ADAPTER_USER}]}  # fmt: skip
    return [
        _role(PROMETHEUS_USER, PROMETHEUS_RULES),
        _binding(PROMETHEUS_USER, PROMETHEUS_USER, PROMETHEUS_USER),
        _role(ADAPTER_USER, ADAPTER_RULES),
        _binding(ADAPTER_USER, ADAPTER_USER, ADAPTER_USER),
        _binding(f"{ADAPTER_USER}:auth-delegator", "system:auth-delegator", ADAPTER_USER),
        reader,
        *_service(adapter_port),
        *(_api_service(v, ca_pem, adapter_port) for v in CUSTOM_METRICS_VERSIONS),
    ]


def _service(port: int) -> list[Obj]:
    """The adapter's Service: a name for 127.0.0.1, as the controllers' webhook Services are
    here (addons/manifests.py; the API server resolves ExternalName itself)."""
    return [{"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": ADAPTER_SERVICE, "namespace": ADAPTER_NAMESPACE},
             "spec": {"type": "ExternalName", "externalName": LOOPBACK,
                      "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}]  # fmt: skip


def _api_service(version: str, ca_pem: bytes, port: int) -> Obj:
    import base64

    service = {"name": ADAPTER_SERVICE, "namespace": ADAPTER_NAMESPACE, "port": port}
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"{version}.{CUSTOM_METRICS_GROUP}"},
            "spec": {"group": CUSTOM_METRICS_GROUP, "version": version, "service": service,
                     "caBundle": base64.b64encode(ca_pem).decode(), "groupPriorityMinimum": 100,
                     "versionPriority": 200 if version == "v1beta2" else 100}}  # fmt: skip


def prometheus_config(kubeconfig: Path) -> dict[str, Any]:
    """Scrape every running pod's container port named ``metrics``, labelled with its namespace
    and pod (the labels the adapter's rules map to objects); evaluate gpufleet's recording rules
    and alerts."""
    relabel = [
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
         "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]  # fmt: skip
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(ALERT_RULES_FILE)],
        "scrape_configs": [{
            "job_name": "pods", "scrape_timeout": "4s",
            "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
            "relabel_configs": relabel,
        }],
    }  # fmt: skip


class MetricsPipeline:
    """Prometheus and Prometheus Adapter for a real-node cluster; ports chosen at ``plan``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory / "metrics"
        self.prometheus_port, self.adapter_port = free_ports(2, cluster=True)

    @staticmethod
    def check(binaries: Path) -> None:
        """Both executables are there (before anything starts)."""
        missing = [n for n in BINARIES if not (binaries / n).is_file()]
        if missing:
            raise ClusterUpError(
                f"--metrics-pipeline needs {', '.join(missing)} in {binaries}: "
                f"scripts/build-controlplane.sh {' '.join(missing)}"
            )

    def start(self, ctx: NodeContext, processes: Processes, nodes: int, timeout: float) -> None:
        """Routes to the pods, the objects, Prometheus, the adapter; ready when the API server
        serves the custom metrics API through it."""
        self.routes(nodes)
        ctx.api.create_all(objects(self.adapter_port, ctx.pki.ca.read_bytes()))
        # in the cluster's state, where `down` and the tests find them
        processes.state.ports.update({PROMETHEUS: self.prometheus_port,
                                      ADAPTER: self.adapter_port})  # fmt: skip
        processes.start(self.prometheus(ctx), timeout)
        processes.start(self.adapter(ctx), timeout)
        wait(lambda: custom_metrics_available(ctx), "custom metrics API", timeout, processes.log)
        processes.log(f"  Prometheus at http://127.0.0.1:{self.prometheus_port}")

    def routes(self, nodes: int) -> None:
        """The host's routes to each node's pods (they go with the bridge at ``down``)."""
        for index in range(nodes):
            network.ip("route", "replace", network.pod_cidr(index), "via",
                       network.node_ip(index), "dev", network.BRIDGE)  # fmt: skip

    def prometheus(self, ctx: NodeContext) -> Component:
        kubeconfig = ctx.issue_client(PROMETHEUS, PROMETHEUS_USER)
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(kubeconfig)))
        listen = f"127.0.0.1:{self.prometheus_port}"
        argv = [str(ctx.binaries / PROMETHEUS), f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'tsdb'}", f"--web.listen-address={listen}",
                "--storage.tsdb.retention.time=1d"]  # fmt: skip
        return Component(PROMETHEUS, argv, lambda: _get(f"http://{listen}/-/ready"))

    def rules(self) -> Path:
        """The adapter's rules (deploy/prometheus/adapter-rules.yaml) with LOCAL_WINDOW."""
        text = ADAPTER_RULES_FILE.read_text()
        if RULES_WINDOW not in text:
            raise ClusterUpError(f"{ADAPTER_RULES_FILE}: no rate window {RULES_WINDOW} to shorten")
        self.dir.mkdir(parents=True, exist_ok=True)
        local = self.dir / ADAPTER_RULES_FILE.name
        local.write_text(text.replace(RULES_WINDOW, LOCAL_WINDOW))
        return local

    def adapter(self, ctx: NodeContext) -> Component:
        """The adapter on 127.0.0.1, its serving certificate of the cluster's CA for the name
        the aggregator checks (<service>.<namespace>.svc)."""
        import ssl

        kubeconfig = ctx.issue_client(ADAPTER, ADAPTER_USER)
        serving = f"{ADAPTER_SERVICE}.{ADAPTER_NAMESPACE}.svc"
        cert = issue(ctx.pki, "prometheus-adapter-serving", ADAPTER_SERVICE,
                     server_names=(serving,), ips=(LOOPBACK,))  # fmt: skip
        argv = [str(ctx.binaries / ADAPTER),
                *(f"--{use}-kubeconfig={kubeconfig}"
                  for use in ("lister", "authentication", "authorization")),
                f"--bind-address={LOOPBACK}", f"--secure-port={self.adapter_port}",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={ctx.pki.key('prometheus-adapter-serving')}",
                f"--prometheus-url=http://127.0.0.1:{self.prometheus_port}/",
                f"--metrics-relist-interval={RELIST_INTERVAL}",
                f"--config={self.rules()}", "--v=1"]  # fmt: skip
        tls = ssl.create_default_context(cafile=str(ctx.pki.ca))
        url = f"https://{LOOPBACK}:{self.adapter_port}/readyz"
        return Component(ADAPTER, argv, lambda: _get(url, context=tls))


def custom_metrics_available(ctx: NodeContext) -> bool:
    """Whether the API server reports the custom metrics APIServices Available."""
    from kubernetes import client

    from gpufleet.cluster.apierrors import api_errors

    api = client.CustomObjectsApi(ctx.api.client())
    for version in CUSTOM_METRICS_VERSIONS:
        try:
            obj = api.get_cluster_custom_object("apiregistration.k8s.io", "v1", "apiservices",
                                                f"{version}.{CUSTOM_METRICS_GROUP}")  # fmt: skip
        except api_errors():
            return False
        conditions = (obj.get("status") or {}).get("conditions") or []  # type: ignore[attr-defined]
        if not any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
            return False
    return True
