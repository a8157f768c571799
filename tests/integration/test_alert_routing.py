"""The chart's alert routing (monitoring.alerting): its Alertmanager configuration passes a real
Alertmanager's check, routes by severity and tenant as documented, and, live, a real Prometheus
evaluating gpufleet's rules hands a real Alertmanager alerts that it posts to the right loopback
receivers, hook URLs and token read from the mounted Secrets' files."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.alertmanager import Post, Receiver, alertmanager, amtool, needs_alertmanager
from tests.support.chart import CHART, helm, needs_helm
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.kubelet import answering_kubelet
from tests.support.procs import poll_until, stop_processes
from tests.support.prometheus import prometheus, query, rules_pending_for, static
from tests.support.scrape import served_port, stuck_job

pytestmark = [needs_helm, needs_alertmanager, pytest.mark.slow]  # real servers

HOOKS = "alert-hooks"  # the Secret the receivers name
TOKEN = "s3cret-oncall-token"
TEAM_A = {"namespace": "team-a"}


def alerting(hook_base: str, **timing: str) -> dict[str, Any]:
    """Values: critical pages oncall (and goes on), team-a's alerts reach its Mattermost, the
    rest of critical and warning the platform's Slack; info is dropped."""
    return {
        "enabled": True,
        "receivers": [
            {"name": "platform", "slack": {"secret": {"name": HOOKS, "key": "slack"},
                                           "channel": "#gpu-platform"}},
            {"name": "team-a", "mattermost": {"secret": {"name": HOOKS, "key": "team-a"}}},
            {"name": "oncall", "webhook": {"url": f"{hook_base}/oncall",
                                           "tokenSecret": {"name": HOOKS, "key": "oncall"}}},
        ],
        "routes": [
            {"receiver": "oncall", "severities": ["critical"], "continue": True},
            {"receiver": "team-a", "tenants": ["team-a"]},
            {"receiver": "platform", "severities": ["critical", "warning"]},
        ],
        **timing,
    }  # fmt: skip


def _secret(values_file: Path) -> dict[str, Any]:
    """The chart's alerting Secret for a values file."""
    proc = helm("template", "g", str(CHART), "-f", str(values_file),
                "--show-only", "templates/alerting.yaml")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    secret: dict[str, Any] = yaml.safe_load(proc.stdout)
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "g-alertmanager"
    return secret


def _config_file(tmp_path: Path, secret: dict[str, Any]) -> Path:
    config = tmp_path / "alertmanager.yaml"
    config.write_text(secret["stringData"]["alertmanager.yaml"])
    return config


def rendered(tmp_path: Path, values: dict[str, Any]) -> Path:
    """The chart's alertmanager.yaml for these monitoring.alerting values, written to a file."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"monitoring": {"alerting": values}}))
    return _config_file(tmp_path, _secret(path))


def test_the_configuration_passes_amtool_and_holds_no_hook_url(tmp_path: Path) -> None:
    config = rendered(tmp_path, alerting("https://oncall.example.com"))
    proc = amtool("check-config", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    receivers = {r["name"]: r for r in yaml.safe_load(config.read_text())["receivers"]}
    slack = receivers["platform"]["slack_configs"][0]
    # Hook URLs carry their secret: only the mounted Secret's file is named.
    assert "api_url" not in slack
    assert slack["api_url_file"] == f"/etc/alertmanager/secrets/{HOOKS}/slack"
    auth = receivers["oncall"]["webhook_configs"][0]["http_config"]["authorization"]
    assert auth == {
        "type": "Bearer",
        "credentials_file": f"/etc/alertmanager/secrets/{HOOKS}/oncall",
    }


def test_the_onprem_designs_routing_passes_amtool(tmp_path: Path) -> None:
    """The 50-node design's values (ci/): the Secret goes to the Alertmanager's namespace, and
    critical alerts of the llm tenant page oncall and reach the research channel."""
    secret = _secret(CHART / "ci" / "onprem-50node-values.yaml")
    assert secret["metadata"]["namespace"] == "monitoring"
    config = _config_file(tmp_path, secret)
    assert amtool("check-config", str(config)).returncode == 0
    proc = amtool("config", "routes", "test", f"--config.file={config}", "severity=critical",
                  "namespace=llm")  # fmt: skip
    assert proc.stdout.strip() == "oncall,research", proc.stdout + proc.stderr


ROUTED = [
    ({"severity": "critical", "namespace": "team-a"}, "oncall,team-a"),
    ({"severity": "critical", "namespace": "gpufleet-system"}, "oncall,platform"),
    ({"severity": "critical"}, "oncall,platform"),  # a node's alert: no namespace
    ({"severity": "warning", "namespace": "team-a"}, "team-a"),
    ({"severity": "warning", "namespace": "team-ab"}, "platform"),  # whole names only
    ({"severity": "warning", "namespace": "team-b"}, "platform"),
    ({"severity": "info", "namespace": "team-b"}, "gpufleet-dropped"),
]


@pytest.mark.parametrize(("labels", "receivers"), ROUTED, ids=[r for _, r in ROUTED])
def test_alerts_are_routed_by_severity_and_tenant(
    tmp_path: Path, labels: dict[str, str], receivers: str
) -> None:
    """Alertmanager's own routing (amtool) over the rendered tree."""
    config = rendered(tmp_path, alerting("https://oncall.example.com"))
    args = [f"{k}={v}" for k, v in labels.items()]
    proc = amtool("config", "routes", "test", f"--config.file={config}", "alertname=A", *args)
    assert proc.stdout.strip() == receivers, proc.stdout + proc.stderr


def _titles(posts: list[Post]) -> list[str]:
    return [a["title"] for p in posts for a in p.body.get("attachments", [])]


def _alertnames(posts: list[Post]) -> list[str]:
    return [a["labels"]["alertname"] for p in posts for a in p.body.get("alerts", [])]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_prometheus_alerts_reach_the_routed_receivers(tmp_path: Path, workdir: Path) -> None:
    """A hardware XID on a simulated GPU (critical, a node's) pages oncall with the bearer token
    and reaches the platform's Slack; a job of team-a without progress (warning) reaches team-a's
    Mattermost and no one else."""
    receiver = Receiver()
    base = f"http://127.0.0.1:{receiver.port}"
    secrets = tmp_path / "secrets" / HOOKS
    secrets.mkdir(parents=True)
    (secrets / "slack").write_text(f"{base}/slack\n")
    (secrets / "team-a").write_text(f"{base}/mattermost-team-a\n")
    (secrets / "oncall").write_text(TOKEN + "\n")
    values = alerting(base, groupWait="1s", groupInterval="1s", repeatInterval="1h")
    values["secretsDir"] = str(tmp_path / "secrets")
    config = rendered(tmp_path, values)
    procs: list[subprocess.Popen[str]] = []
    try:
        with answering_kubelet() as kubelet, stuck_job() as job_port:
            exporter = subprocess.Popen(
                gpufleet_cmd("exporter", "--simulate", "2", "--simulate-failure", "0:79",
                             "--port", "0", "--node", "n1", "--pod-resources", kubelet.socket),
                cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            procs.append(exporter)
            scrapes = [
                static("gpufleet-exporter", f"127.0.0.1:{served_port(exporter)}"),
                # As the chart's PodMonitor labels a tenant's worker pod.
                {"job_name": "gpufleet-job",
                 "static_configs": [{"targets": [f"127.0.0.1:{job_port}"], "labels": TEAM_A}]},
            ]  # fmt: skip
            # GpufleetJobNoProgress fires after 2 s pending instead of a minute (when: promtool)
            rules = rules_pending_for(tmp_path, 2)
            with (alertmanager(tmp_path, config) as am,
                  prometheus(tmp_path, scrapes, am, rules) as prom):  # fmt: skip
                _routed_live(receiver, exporter, prom)
    finally:
        stop_processes(procs)
        receiver.close()


def _routed_live(receiver: Receiver, exporter: subprocess.Popen[str], prom: int) -> None:
    # The hardware XID counter must be scraped at 0 before the event for increase() to see it.
    xid79 = 'gpufleet_gpu_xid_errors_total{gpu="0", xid="79"} == 0'
    poll_until(lambda: query(prom, xid79), what="XID 79 scraped at 0", timeout=60,
               interval=0.5, retry_on=(OSError,))  # fmt: skip
    exporter.send_signal(signal.SIGUSR1)

    def arrived() -> bool:
        return ("GpufleetGpuXidHardware" in _alertnames(receiver.at("/oncall"))
                and any("GpufleetGpuXidHardware" in t for t in _titles(receiver.at("/slack")))
                and any("GpufleetJobNoProgress" in t
                        for t in _titles(receiver.at("/mattermost-team-a"))))  # fmt: skip

    poll_until(arrived, what="alerts at their receivers", timeout=180, interval=1)
    time.sleep(3)  # a misrouted copy would be posted in the same dispatch
    oncall = receiver.at("/oncall")
    assert {p.authorization for p in oncall} == {f"Bearer {TOKEN}"}
    xid = next(a for p in oncall for a in p.body["alerts"])
    assert xid["labels"]["severity"] == "critical" and xid["labels"]["xid"] == "79"
    assert xid["labels"]["node"] == "n1"
    assert "GpufleetJobNoProgress" not in _alertnames(oncall)
    slack = receiver.at("/slack")
    assert {p.body["channel"] for p in slack} == {"#gpu-platform"}
    assert not any("GpufleetJobNoProgress" in t for t in _titles(slack))
    texts = [a["text"] for p in slack for a in p.body["attachments"]]
    assert any("reported hardware XID 79" in t and "#gpufleetgpuxidhardware" in t for t in texts)
    team = receiver.at("/mattermost-team-a")
    assert not any("GpufleetGpuXid" in t for t in _titles(team))
    texts = [a["text"] for p in team for a in p.body["attachments"]]
    assert any("*warning* Job team-a/train has made no progress" in t for t in texts), texts
