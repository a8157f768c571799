"""What ``gpufleet doctor`` reads of a cluster, once, through the official client: every read
that the API server refuses is kept as its one-line reason, and the checks that needed it say
so instead of guessing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from gpufleet.cluster.access import as_dict, items
from gpufleet.cluster.apierrors import api_errors, to_cluster_error
from gpufleet.cluster.doctor.requirements import (
    CONTROLLERS,
    DNS_NAMESPACE,
    DNS_SELECTOR,
    KUEUE_CONFIGMAP,
    MANAGER_CONFIG_KEY,
    PLATFORM_CHART_LABEL,
    RDMA_POLICY,
)
from gpufleet.kube import Obj


@dataclass
class Facts:
    """The cluster as ``doctor`` saw it (API dicts); ``errors``: what could not be read, why."""

    version: str = ""
    crds: dict[str, Obj] = field(default_factory=dict)
    deployments: list[Obj] = field(default_factory=list)
    leases: list[Obj] = field(default_factory=list)
    # Kueue's configuration from its ConfigMap (None: no such ConfigMap).
    kueue_config: dict[str, Any] | None = None
    nodes: list[Obj] = field(default_factory=list)
    daemonsets: list[Obj] = field(default_factory=list)
    storage_classes: list[Obj] = field(default_factory=list)
    namespaces: list[Obj] = field(default_factory=list)
    dns_services: list[Obj] = field(default_factory=list)
    dns_endpoints: list[Obj] = field(default_factory=list)  # their EndpointSlices
    # The Services that webhook configurations call (namespace/name).
    webhook_services: set[str] = field(default_factory=set)
    # The probe of each installed controller whose webhooks are configured, by Deployment
    # name: "" passed, else why not.
    probes: dict[str, str] = field(default_factory=dict)
    # The pods of the platform chart's workloads that are short of ready pods, and the events
    # of their namespaces (why a pod cannot start: a failed mount, a refused pod).
    platform_pods: list[Obj] = field(default_factory=list)
    platform_events: list[Obj] = field(default_factory=list)
    # Whether the chart's RDMA policy and its binding are both there.
    rdma_policy: bool = False
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    errors: dict[str, str] = field(default_factory=dict)


def gather(api_client: Any) -> Facts:
    """Read everything the checks need through ``api_client`` (a kubernetes ApiClient)."""
    from kubernetes import client

    reader = _Reader(Facts())
    facts = reader.facts
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    try:
        facts.version = client.VersionApi(api_client).get_code().git_version
    except api_errors() as exc:
        facts.errors["version"] = str(to_cluster_error(exc, "read the API server's version"))
    crds = reader.read(
        "crds", client.ApiextensionsV1Api(api_client).list_custom_resource_definition
    )
    facts.crds = {c["metadata"]["name"]: c for c in crds}
    facts.deployments = reader.read("deployments", apps.list_deployment_for_all_namespaces)
    coordination = client.CoordinationV1Api(api_client)
    facts.leases = reader.read("leases", coordination.list_lease_for_all_namespaces)
    facts.daemonsets = reader.read("daemonsets", apps.list_daemon_set_for_all_namespaces)
    facts.nodes = reader.read("nodes", core.list_node)
    _platform(reader, core)
    facts.namespaces = reader.read("namespaces", core.list_namespace)
    storage = client.StorageV1Api(api_client)
    facts.storage_classes = reader.read("storageclasses", storage.list_storage_class)
    _dns(reader, core, client.DiscoveryV1Api(api_client))
    maps = reader.read("kueue-config", core.list_config_map_for_all_namespaces,
                       field_selector=f"metadata.name={KUEUE_CONFIGMAP}")  # fmt: skip
    for cm in maps:
        loaded = yaml.safe_load((cm.get("data") or {}).get(MANAGER_CONFIG_KEY) or "")
        facts.kueue_config = loaded if isinstance(loaded, dict) else {}
    admission = client.AdmissionregistrationV1Api(api_client)
    hooks = [*reader.read("webhooks", admission.list_validating_webhook_configuration),
             *reader.read("webhooks", admission.list_mutating_webhook_configuration)]  # fmt: skip
    facts.webhook_services = {
        f"{service.get('namespace')}/{service.get('name')}"
        for c in hooks
        for w in c.get("webhooks") or []
        if (service := (w.get("clientConfig") or {}).get("service"))
    }
    facts.probes = _probes(client.CustomObjectsApi(api_client), facts)
    policies = reader.read("rdma-policy", admission.list_validating_admission_policy)
    bindings = reader.read("rdma-policy", admission.list_validating_admission_policy_binding)
    facts.rdma_policy = all(any(o["metadata"]["name"] == RDMA_POLICY for o in objects)
                            for objects in (policies, bindings))  # fmt: skip
    return facts


class _Reader:
    """List calls whose refusal is kept in ``facts.errors`` under the check's key."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts

    def read(self, key: str, call: Callable[..., Any], **kwargs: Any) -> list[Obj]:
        try:
            return [as_dict(o) for o in items(call(**kwargs))]
        except api_errors() as exc:
            doing = call.__name__.replace("_", " ") + (f" ({kwargs})" if kwargs else "")
            self.facts.errors[key] = str(to_cluster_error(exc, doing))
            return []


def platform_workloads(facts: Facts) -> list[tuple[str, Obj]]:
    """The platform chart's DaemonSets and Deployments, each with its kind."""
    listed = [*(("DaemonSet", d) for d in facts.daemonsets),
              *(("Deployment", d) for d in facts.deployments)]  # fmt: skip
    key, prefix = PLATFORM_CHART_LABEL
    chart = [(k, w, (w["metadata"].get("labels") or {}).get(key, "")) for k, w in listed]
    return [(k, w) for k, w, label in chart if str(label).startswith(prefix)]


def not_ready(kind: str, workload: Obj) -> bool:
    """Whether a DaemonSet (ready on every node it schedules) or a Deployment (every replica
    ready) is short of ready pods."""
    status = workload.get("status") or {}
    if kind == "DaemonSet":
        return int(status.get("numberReady") or 0) < int(status.get("desiredNumberScheduled") or 0)
    wanted = int((workload.get("spec") or {}).get("replicas", 1))
    return int(status.get("readyReplicas") or 0) < wanted


def _platform(reader: _Reader, core: Any) -> None:
    """The pods and events behind the platform's workloads that are not ready (read only
    then: a healthy platform costs no more reads)."""
    facts = reader.facts
    short = [w for k, w in platform_workloads(facts) if not_ready(k, w)]
    for namespace in sorted({w["metadata"]["namespace"] for w in short}):
        facts.platform_pods += reader.read("platform", core.list_namespaced_pod,
                                           namespace=namespace)  # fmt: skip
        facts.platform_events += reader.read("platform", core.list_namespaced_event,
                                             namespace=namespace)  # fmt: skip


def _dns(reader: _Reader, core: Any, discovery: Any) -> None:
    """The cluster DNS Services and their EndpointSlices."""
    facts = reader.facts
    facts.dns_services = reader.read(
        "dns", core.list_namespaced_service, namespace=DNS_NAMESPACE, label_selector=DNS_SELECTOR
    )
    for service in facts.dns_services:
        selector = f"kubernetes.io/service-name={service['metadata']['name']}"
        facts.dns_endpoints += reader.read(
            "dns", discovery.list_namespaced_endpoint_slice, namespace=DNS_NAMESPACE,
            label_selector=selector,
        )  # fmt: skip


def _probes(custom: Any, facts: Facts) -> dict[str, str]:
    """Create each probe with dryRun (nothing is stored) where its controller is installed
    and its webhooks configured: the API server calls them, so success means they answer."""
    out = {}
    called = {s.split("/")[1] for s in facts.webhook_services}
    for c in CONTROLLERS:
        if not all(name in facts.crds for name, _ in c.crds):
            continue
        for p in c.processes:
            if p.probe is None or p.webhook_service not in called:
                continue
            group, version = p.probe["apiVersion"].split("/")
            plural, ns = p.probe["kind"].lower() + "s", p.probe["metadata"].get("namespace")
            try:
                if ns:
                    custom.create_namespaced_custom_object(
                        group, version, ns, plural, p.probe, dry_run="All"
                    )
                else:
                    custom.create_cluster_custom_object(group, version, plural, p.probe,
                                                        dry_run="All")  # fmt: skip
                out[p.deployment] = ""
            except api_errors() as exc:
                doing = f"dry-run create of a {p.probe['kind']}"
                out[p.deployment] = str(to_cluster_error(exc, doing))
    return out
