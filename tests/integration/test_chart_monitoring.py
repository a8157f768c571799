"""The chart's monitoring objects: the exporter DaemonSet and its RBAC and network policy,
the ServiceMonitor and PodMonitor (every metrics pod scraped exactly once), the PrometheusRule
(the promtool-tested file) and the dashboards' ConfigMaps. Alert routing: test_alert_routing.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.render import TARGETS, check_restricted
from tests.support.chart import CHART, helm, needs_helm, template
from tests.support.k8s_schemas import validate_strictly
from tests.support.paths import REPO
from tests.support.specs import cluster_job, pod_templates

pytestmark = needs_helm

LAB = yaml.safe_load((CHART / "ci" / "lab-3node-a30-values.yaml").read_text())


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def test_exporter_daemonset_service_rbac_and_network_policy() -> None:
    objs = _by_kind(template(CHART / "ci" / "lab-3node-a30-values.yaml"))
    (ds,) = objs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:2] == ["gpufleet", "exporter"]
    assert "--address=0.0.0.0" in c["command"] and "--pod-labels" in c["command"]
    assert "--pod-resources=/var/lib/kubelet/pod-resources/kubelet.sock" in c["command"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
    assert "nvidia.com/gpu" not in str(c["resources"])  # reads NVML without taking a GPU
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["volumes"] == [{"name": "pod-resources", "hostPath": {
        "path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}]  # fmt: skip
    assert c["volumeMounts"][0]["readOnly"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (role,) = [r for r in objs["ClusterRole"] if r["metadata"]["name"] == "gpufleet-exporter"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    policy = next(n for n in objs["NetworkPolicy"] if n["metadata"]["name"] == "gpufleet-exporter")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}  # fmt: skip


def test_the_kubelets_root_elsewhere_moves_only_the_host_side_of_the_socket() -> None:
    """monitoring.exporter.podResources.kubeletDir: a kubelet rooted elsewhere (k0s) has its
    pod-resources directory mounted where the exporter reads it; a relative one is refused."""
    proc = helm("template", "gpufleet", str(CHART), "--namespace", "gpufleet-system", "--set",
                "monitoring.exporter.podResources.kubeletDir=/var/lib/k0s/kubelet/")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (ds,) = _by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/var/lib/kubelet/pod-resources"
    refused = helm("template", "gpufleet", str(CHART), "--set",
                   "monitoring.exporter.podResources.kubeletDir=kubelet")  # fmt: skip
    assert refused.returncode != 0 and "kubeletDir" in refused.stderr


def test_exporter_without_pod_resources_passes_restricted() -> None:
    proc = helm("template", "gpufleet", str(CHART), "--namespace", "gpufleet-system",
                "--set", "monitoring.exporter.podResources.enabled=false",
                "--set", "monitoring.exporter.podResources.podLabels=false")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    objs = _by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])
    (ds,) = objs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert "volumes" not in pod and pod["automountServiceAccountToken"] is False
    assert not check_restricted(pod, "spec")
    assert not [r for r in objs.get("ClusterRole", []) if "exporter" in r["metadata"]["name"]]


def test_monitors_keep_the_exporters_labels_and_find_job_pods() -> None:
    objs = _by_kind(template(CHART / "ci" / "lab-3node-a30-values.yaml"))
    (sm,) = objs["ServiceMonitor"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert {"action": "replace", "targetLabel": "job",
            "replacement": "gpufleet-exporter"} in endpoint["relabelings"]  # fmt: skip
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (pm,) = objs["PodMonitor"]
    assert pm["spec"]["namespaceSelector"]["matchNames"] == [t["name"] for t in LAB["tenants"]]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    # which pods it selects: test_every_metrics_pod_is_scraped_exactly_once


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against ``labels``."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        matches = {
            "In": present and value in e.get("values", []),
            "NotIn": value not in e.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }
        if not matches[e["operator"]]:
            return False
    return True


def _scrapers(monitors: list[dict[str, Any]], namespace: str, pod: dict[str, Any]) -> list[str]:
    """The PodMonitors that scrape ``pod`` (a template in ``namespace``) on one of its ports."""
    ports = {p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    labels = pod["metadata"]["labels"]
    out = []
    for m in monitors:
        names = m["spec"].get("namespaceSelector", {}).get("matchNames")
        where = names if names is not None else [m["metadata"].get("namespace", namespace)]
        endpoints = {e["port"] for e in m["spec"]["podMetricsEndpoints"]}
        if namespace in where and _selects(m["spec"]["selector"], labels) and endpoints & ports:
            out.append(m["metadata"]["name"])
    return out


@pytest.mark.parametrize("own", [False, True], ids=["chart-monitor", "job-monitor"])
@pytest.mark.parametrize("target", [t for t in TARGETS if t not in ("trainjob", "rayjob")])
def test_every_metrics_pod_is_scraped_exactly_once(target: str, own: bool) -> None:
    """Each pod that serves metrics is selected by exactly one monitor, on its `metrics` port:
    the chart's, or the job's own (spec.metrics.podMonitor), which used to scrape the same pods
    a second time under another job label (issue 14). TrainJob carries no metrics port; a Ray
    job has none of gpufleet's (Ray exports its own)."""
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    chart = [o for o in template(CHART / "ci" / "lab-3node-a30-values.yaml")
             if o["kind"] == "PodMonitor"]  # fmt: skip
    doc = cluster_job(target=target, metrics={"port": 9200, "podMonitor": own})
    doc["metadata"]["namespace"] = "research"  # a tenant of the lab values
    objects = render(validate_training_job(doc), target)
    monitors = chart + [o for o in objects if o["kind"] == "PodMonitor"]
    pods = [p for o in objects for p in pod_templates(o)
            if any(port.get("name") == "metrics" for c in p["spec"]["containers"]
                   for port in c.get("ports", []))]  # fmt: skip
    assert pods, f"{target}: no pod serves metrics"
    for pod in pods:
        expected = ["train"] if own else ["gpufleet-workloads"]
        assert _scrapers(monitors, "research", pod) == expected, pod["metadata"]["labels"]


def test_triton_servers_are_scraped_exactly_once() -> None:
    """Triton's metrics (port `metrics`, 8002) feed the inference dashboard, the adapter rules
    and so the autoscaler; the chart's monitors selected workers only (issue 14)."""
    from gpufleet.render import render_spec
    from gpufleet.spec import validate_spec

    chart = template(CHART / "ci" / "lab-3node-a30-values.yaml")
    monitors = [o for o in chart if o["kind"] == "PodMonitor"]
    doc = yaml.safe_load((REPO / "examples" / "digits-serving.yaml").read_text())
    doc["metadata"]["namespace"] = "product"  # a tenant of the lab values
    svc = validate_spec(doc)
    (pod,) = [p for o in render_spec(svc, "triton") for p in pod_templates(o)]
    assert _scrapers(monitors, "product", pod) == ["gpufleet-workloads"]
    assert _scrapers(monitors, "team-x", pod) == []  # not a tenant of this install


def test_prometheus_rule_is_the_tested_rule_file(tmp_path: Path) -> None:
    objs = _by_kind(template(CHART / "ci" / "lab-3node-a30-values.yaml"))
    (rule,) = objs["PrometheusRule"]
    source = yaml.safe_load((REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]  # templates like {{ $labels.gpu }} intact
    promtool = shutil.which("promtool")
    if promtool:
        rendered = tmp_path / "rules.yaml"
        rendered.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        proc = subprocess.run([promtool, "check", "rules", str(rendered)], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_runbook_links_follow_the_base_url_value(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    base = "https://wiki.example.org/gpu/runbooks"
    values.write_text(yaml.safe_dump({"monitoring": {"prometheusRule": {
        "enabled": True, "runbookBaseUrl": base}}}))  # fmt: skip
    (rule,) = _by_kind(template(values))["PrometheusRule"]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{base}#{alert['alert'].lower()}"


def test_dashboards_ship_as_sidecar_config_maps() -> None:
    objs = _by_kind(template(CHART / "ci" / "lab-3node-a30-values.yaml"))
    maps = [m for m in objs["ConfigMap"] if "dashboard" in m["metadata"]["name"]]
    files = sorted((REPO / "deploy" / "grafana").glob("*.json"))
    assert len(maps) == len(files) >= 5
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"]["grafana_folder"] == "gpufleet"
        ((name, text),) = m["data"].items()
        assert json.loads(text) == json.loads((REPO / "deploy" / "grafana" / name).read_text())


def test_the_exporter_serves_https_and_its_service_monitor_scrapes_with_the_secrets_ca() -> None:
    """monitoring.exporter.tls: the DaemonSet mounts the kubernetes.io/tls Secret read-only for
    the group the exporter runs as, passes it to --tls-cert/--tls-key and probes over HTTPS; the
    ServiceMonitor scrapes https, trusting the Secret's ca.crt and checking serverName. The
    exporter without pod-resources still passes restricted."""
    proc = helm("template", "gpufleet", str(CHART), "--namespace", "gpufleet-system",
                "--set", "monitoring.exporter.tls.secretName=exporter-tls",
                "--set", "monitoring.exporter.tls.serverName=exporter.gpufleet-system.svc",
                "--set", "monitoring.serviceMonitor.enabled=true",
                "--set", "monitoring.exporter.podResources.enabled=false",
                "--set", "monitoring.exporter.podResources.podLabels=false")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    objs = _by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])
    (ds,) = objs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (volume,) = pod["volumes"]
    assert volume["secret"]["secretName"] == "exporter-tls"
    assert volume["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 1000
    (mount,) = c["volumeMounts"]
    assert mount["readOnly"] is True
    assert f"--tls-cert={mount['mountPath']}/tls.crt" in c["command"]
    assert f"--tls-key={mount['mountPath']}/tls.key" in c["command"]
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert not check_restricted(pod, "spec")
    (sm,) = objs["ServiceMonitor"]
    validate_strictly(sm)
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "exporter-tls", "key": "ca.crt"}},
                                     "serverName": "exporter.gpufleet-system.svc"}  # fmt: skip
