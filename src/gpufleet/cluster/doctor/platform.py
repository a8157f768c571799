"""The platform's checks of ``gpufleet doctor`` (pure, from Facts): GPU nodes (resource,
discovery labels, taint), the device plugin, a default StorageClass, the tenants' Pod Security,
cluster DNS, the Prometheus Operator's kinds and, where tenants use it, RDMA."""

from __future__ import annotations

from gpufleet.cluster.doctor.facts import Facts
from gpufleet.cluster.doctor.findings import Finding, fail, ok, unreadable, warn
from gpufleet.cluster.doctor.requirements import (
    DEFAULT_STORAGE_CLASS,
    DEVICE_PLUGIN,
    DNS_NAMESPACE,
    DNS_SELECTOR,
    GPU_LABELS,
    GPU_TAINT,
    NAD_CRD,
    POD_SECURITY_ENFORCE,
    PROMETHEUS_OPERATOR_CRDS,
    RDMA_POLICY,
    TENANT_POD_SECURITY,
)
from gpufleet.kube import LABEL_RDMA, LABEL_TENANT, Obj
from gpufleet.render.podspec import GPU_RESOURCE
from gpufleet.spec import RDMA_RESOURCE_PREFIX


def gpu_nodes(facts: Facts) -> list[Finding]:
    """Nodes advertising GPUs; those without the discovery labels or the GPU taint."""
    if "nodes" in facts.errors:
        return [unreadable("gpu nodes", facts.errors["nodes"])]
    gpus = {n["metadata"]["name"]: _gpus(n) for n in facts.nodes if _gpus(n)}
    if not gpus:
        return [
            fail(
                "gpu nodes",
                f"no node advertises {GPU_RESOURCE}",
                "install the NVIDIA GPU Operator (or the device plugin) on the GPU nodes",
            )
        ]
    nodes = [n for n in facts.nodes if n["metadata"]["name"] in gpus]
    products = sorted({(n["metadata"].get("labels") or {}).get(GPU_LABELS[0], "?") for n in nodes})
    out = [
        ok("gpu nodes", f"{len(gpus)} node(s), {sum(gpus.values())} GPU(s): {', '.join(products)}")
    ]
    unlabelled = [
        n["metadata"]["name"]
        for n in nodes
        if not set(GPU_LABELS) <= set(n["metadata"].get("labels") or {})
    ]
    if unlabelled:
        out.append(
            warn(
                "gpu labels",
                f"{_few(unlabelled)} lack {', '.join(GPU_LABELS)}: "
                "resources.gpuProduct cannot select them",
                "run GPU feature discovery (the GPU Operator's, or NFD with gpu-feature-discovery)",
            )
        )
    untainted = [n["metadata"]["name"] for n in nodes if not _tainted(n)]
    if untainted:
        out.append(
            warn(
                "gpu taint",
                f"{_few(untainted)} not tainted {GPU_TAINT}:NoSchedule: "
                "pods without GPUs may fill them",
                f"kubectl taint node NODE {GPU_TAINT}=present:NoSchedule",
            )
        )
    return out


def device_plugin(facts: Facts) -> Finding:
    """The NVIDIA device plugin's DaemonSet ready on its nodes."""
    if "daemonsets" in facts.errors:
        return unreadable("device plugin", facts.errors["daemonsets"])
    found = [d for d in facts.daemonsets if DEVICE_PLUGIN in d["metadata"]["name"]]
    if not found:
        return warn(
            "device plugin",
            f"no DaemonSet named *{DEVICE_PLUGIN}*: GPUs are advertised "
            "some other way (kwok, an extended resource), and "
            "containers get no GPU device from the kubelet",
            "install the NVIDIA GPU Operator or the device plugin",
        )
    for d in found:
        status = d.get("status") or {}
        want, ready = status.get("desiredNumberScheduled") or 0, status.get("numberReady") or 0
        name = f"{d['metadata']['namespace']}/{d['metadata']['name']}"
        if not want or ready < want:
            return fail(
                "device plugin",
                f"DaemonSet {name}: {ready}/{want} ready",
                f"kubectl -n {d['metadata']['namespace']} describe daemonset "
                f"{d['metadata']['name']}",
            )
    return ok("device plugin", f"DaemonSet {name}: {ready}/{want} ready")


def default_storage_class(facts: Facts) -> Finding:
    if "storageclasses" in facts.errors:
        return unreadable("storage", facts.errors["storageclasses"])
    default = [
        s["metadata"]["name"]
        for s in facts.storage_classes
        if (s["metadata"].get("annotations") or {}).get(DEFAULT_STORAGE_CLASS) == "true"
    ]
    if default:
        return ok("storage", f"default StorageClass {default[0]}")
    others = [s["metadata"]["name"] for s in facts.storage_classes]
    return warn(
        "storage",
        "no default StorageClass: a claim without storageClassName stays "
        f"Pending (classes: {', '.join(others) or 'none'})",
        f"kubectl annotate storageclass CLASS {DEFAULT_STORAGE_CLASS}=true, or name "
        "classes in the chart's storage tiers",
    )


def tenant_pod_security(facts: Facts) -> Finding:
    """Every tenant namespace (the chart's label) enforces TENANT_POD_SECURITY; an RDMA
    tenant, privileged held to restricted plus IPC_LOCK by the chart's policy (rdma_security)."""
    if "namespaces" in facts.errors:
        return unreadable("pod security", facts.errors["namespaces"])
    tenants = [n for n in facts.namespaces if LABEL_TENANT in (n["metadata"].get("labels") or {})]
    if not tenants:
        return warn(
            "pod security",
            f"no tenant namespace (label {LABEL_TENANT})",
            "install the chart (deploy/helm/gpufleet) with your tenants",
        )
    weak = {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(POD_SECURITY_ENFORCE)
        for n in tenants
        if (n["metadata"].get("labels") or {}).get(LABEL_RDMA) != "true"
    }
    weak = {ns: level for ns, level in weak.items() if level != TENANT_POD_SECURITY}
    if weak:
        what = ", ".join(f"{ns} ({level or 'none'})" for ns, level in sorted(weak.items()))
        return fail(
            "pod security",
            f"tenant namespaces not enforcing {TENANT_POD_SECURITY}: {what}",
            f"kubectl label namespace NS {POD_SECURITY_ENFORCE}={TENANT_POD_SECURITY} --overwrite",
        )
    names = ", ".join(sorted(n["metadata"]["name"] for n in tenants))
    return ok("pod security", f"{len(tenants)} tenant(s) enforce {TENANT_POD_SECURITY}: {names}")


def cluster_dns(facts: Facts) -> Finding:
    """A DNS Service in kube-system with a ready endpoint: a job's pods find pod 0 by name."""
    if "dns" in facts.errors:
        return unreadable("dns", facts.errors["dns"])
    fix = "install CoreDNS (kubeadm's addon, or your distribution's)"
    if not facts.dns_services:
        return fail(
            "dns",
            f"no Service in {DNS_NAMESPACE} labelled {DNS_SELECTOR}: pods cannot "
            "resolve the rendezvous host",
            fix,
        )
    ready = [
        e
        for s in facts.dns_endpoints
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready", True)
    ]
    svc = facts.dns_services[0]["metadata"]["name"]
    if not ready:
        return fail("dns", f"Service {DNS_NAMESPACE}/{svc} has no ready endpoint", fix)
    return ok("dns", f"Service {DNS_NAMESPACE}/{svc}, {len(ready)} ready endpoint(s)")


def prometheus_operator(facts: Facts) -> Finding:
    if "crds" in facts.errors:
        return unreadable("prometheus operator", facts.errors["crds"])
    missing = [c for c in PROMETHEUS_OPERATOR_CRDS if c not in facts.crds]
    if missing:
        return warn(
            "prometheus operator",
            f"missing {', '.join(missing)}: the chart's monitors "
            "and spec.metrics.podMonitor cannot be created",
            "install the Prometheus Operator, or the chart with its monitors off",
        )
    return ok("prometheus operator", "PodMonitor, ServiceMonitor, PrometheusRule")


def rdma_security(facts: Facts, tenants: list[str]) -> Finding | None:
    """RDMA tenants enforce privileged (restricted refuses their IPC_LOCK) and the chart's
    policy holds their pods to restricted plus that; None when they do."""
    levels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(POD_SECURITY_ENFORCE)
              for n in facts.namespaces if n["metadata"]["name"] in tenants}  # fmt: skip
    refusing = sorted(ns for ns, level in levels.items() if level not in (None, "privileged"))
    if refusing:
        return fail("rdma", f"RDMA tenants {', '.join(refusing)} enforce a Pod Security level "
                            "that refuses IPC_LOCK: their RDMA workers cannot start",
                    "install them with the chart (rdma: true)")  # fmt: skip
    if "rdma-policy" in facts.errors:
        return unreadable("rdma", facts.errors["rdma-policy"])
    if not facts.rdma_policy:
        return fail("rdma", f"RDMA tenants {', '.join(tenants)} enforce privileged without the "
                            f"chart's ValidatingAdmissionPolicy {RDMA_POLICY} and its binding: "
                            "their pods are not held to restricted",
                    "install the chart (templates/rdma.yaml)")  # fmt: skip
    return None


def rdma(facts: Facts) -> Finding | None:
    """Where tenants use RDMA (label LABEL_RDMA): Multus' kind, and GPU nodes advertising an
    RDMA device; None where none does."""
    if "namespaces" in facts.errors:
        return None
    tenants = sorted(n["metadata"]["name"] for n in facts.namespaces
                     if (n["metadata"].get("labels") or {}).get(LABEL_RDMA) == "true")  # fmt: skip
    if not tenants:
        return None
    unsafe = rdma_security(facts, tenants)
    if unsafe is not None:
        return unsafe
    if "crds" not in facts.errors and NAD_CRD not in facts.crds:
        return fail("rdma", f"tenants {', '.join(tenants)} use RDMA, but {NAD_CRD} is not "
                            "installed: their networks cannot be attached",
                    "install Multus (or NVIDIA's Network Operator)")  # fmt: skip
    if "nodes" in facts.errors:
        return unreadable("rdma", facts.errors["nodes"])
    devices = sorted({r for n in facts.nodes
                      for r in ((n.get("status") or {}).get("allocatable") or {})
                      if r.startswith(RDMA_RESOURCE_PREFIX)})  # fmt: skip
    if not devices:
        return fail("rdma", f"tenants {', '.join(tenants)} use RDMA, but no node advertises "
                            f"an RDMA device ({RDMA_RESOURCE_PREFIX}...)",
                    "install the RDMA device plugin on the GPU nodes (NVIDIA's Network "
                    "Operator: k8s-rdma-shared-dev-plugin)")  # fmt: skip
    return ok("rdma", f"tenants {', '.join(tenants)}; devices {', '.join(devices)}")


def _gpus(node: Obj) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
    return int(value) if str(value).isdigit() else 0


def _tainted(node: Obj) -> bool:
    return any(
        t.get("key") == GPU_TAINT and t.get("effect") == "NoSchedule"
        for t in (node.get("spec") or {}).get("taints") or []
    )


def _few(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
