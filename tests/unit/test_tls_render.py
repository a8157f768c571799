"""TLS in rendered objects (issue 55 item 3). spec.metrics.tls: HTTPS on a job's metrics port;
the worker pods mount the kubernetes.io/tls Secret read-only where the launcher reads it, say
https in their scrape annotations and leave the chart's plain-HTTP PodMonitor; the job's own
PodMonitor scrapes with the Secret's CA; a Secret that cannot serve is one error naming the
field. An InferenceService's spec.tls: `gpufleet serve` with the Secret's certificate and key,
probed over HTTPS; refused where the server cannot terminate TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UserInputError
from gpufleet.kube import LABEL_MONITOR
from gpufleet.launch.pod import ENV_METRICS_TLS_DIR, metrics_tls
from gpufleet.render import check_restricted, render, render_spec
from gpufleet.spec import validate_training_job
from tests.support.k8s_schemas import validate_strictly
from tests.support.serving import parsed, service
from tests.support.specs import cluster_job, digits_job, pod_templates

TLS = {"secretName": "train-metrics", "serverName": "train.team-a.svc"}


def test_tls_needs_a_port() -> None:
    with pytest.raises(UserInputError) as info:
        validate_training_job(digits_job("t", metrics={"tls": TLS}))
    assert [(e.path, e.message) for e in info.value.errors] == [
        ("spec.metrics.tls", "needs a port to serve on: set spec.metrics.port")]  # fmt: skip


@pytest.mark.parametrize("target", ["job", "jobset"])
def test_pods_mount_the_tls_secret_and_the_pod_monitor_trusts_its_ca(target: str) -> None:
    metrics = {"port": 9500, "podMonitor": True, "tls": TLS}
    objs = render(validate_training_job(cluster_job(target, metrics=metrics)), target)
    for obj in objs:
        validate_strictly(obj)
    (monitor,) = [o for o in objs if o["kind"] == "PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "train-metrics", "key": "ca.crt"}},
                                     "serverName": "train.team-a.svc"}  # fmt: skip
    for template in [t for o in objs for t in pod_templates(o)]:
        meta: dict[str, Any] = template["metadata"]
        assert meta["annotations"]["prometheus.io/scheme"] == "https"
        assert LABEL_MONITOR in meta["labels"]  # not the chart's plain-HTTP PodMonitor's
        (volume,) = [v for v in template["spec"]["volumes"] if v.get("secret")]
        assert volume["secret"]["secretName"] == "train-metrics"
        assert [i["key"] for i in volume["secret"]["items"]] == ["tls.crt", "tls.key"]
        (container,) = template["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert mount["readOnly"] is True and env[ENV_METRICS_TLS_DIR] == mount["mountPath"]


def test_a_tls_secret_that_cannot_serve_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(UserInputError) as info:
        metrics_tls(str(tmp_path))
    assert info.value.errors[0].path == "spec.metrics.tls.secretName"
    assert "tls.crt: no such file" in info.value.errors[0].message
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(UserInputError) as info:
        metrics_tls(str(tmp_path))
    assert "cannot serve TLS" in str(info.value)
    assert metrics_tls(None) is None


def test_a_served_model_over_tls_runs_gpufleet_serve_with_the_secret_and_probes_https() -> None:
    pvc = {"name": "digits", "pvc": {"claimName": "models", "subPath": "repo"}}
    svc = parsed(service(server="gpufleet", image="localhost/gpufleet:cpu", model=pvc,
                         tls={"secretName": "digits-tls"}))  # fmt: skip
    objs = render_spec(svc, "triton")
    for obj in objs:
        validate_strictly(obj)
    pod = objs[0]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v.get("secret")]
    assert (
        volume["secret"]["secretName"] == "digits-tls" and volume["secret"]["defaultMode"] == 0o440
    )
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert f"--tls-cert={mount['mountPath']}/tls.crt" in c["command"]
    assert f"--tls-key={mount['mountPath']}/tls.key" in c["command"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    assert not check_restricted(pod, "spec.template.spec")


def test_tls_needs_the_gpufleet_server() -> None:
    """tritonserver's own HTTP has no TLS: spec.tls with server triton (and so target kserve)
    is refused with the field, not rendered half plain."""
    with pytest.raises(UserInputError) as info:
        parsed(service(tls={"secretName": "digits-tls"}))
    ((path, message),) = [(e.path, e.message) for e in info.value.errors]
    assert path == "spec.tls" and "needs spec.server gpufleet" in message
