"""InferenceService: spec validation, the triton and kserve renderers (strictly valid objects,
restricted pods, the autoscaler's signal), goldens, and submit through the typed clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cluster import Cluster
from gpufleet.errors import EXIT_BAD_INPUT, UserInputError
from gpufleet.kube import LABEL_JOB
from gpufleet.render import check_restricted, pod_specs_in, render_spec
from gpufleet.render.serving import ADAPTER_METRICS
from gpufleet.spec import validate_spec
from tests.support.fake_kube import FakeKube
from tests.support.k8s_schemas import validate_strictly
from tests.support.paths import REPO
from tests.support.serving import adapter_rules, parsed, service

GOLDEN = REPO / "tests" / "golden"


ON_PVC = {"name": "digits", "pvc": {"claimName": "models"}}


MATRIX = [
    pytest.param(spec, id=name)
    for name, spec in [
        ("s3-cpu-fixed", {}),
        (
            "pvc-gpu-hpa-queue",
            {
                "model": {"name": "digits", "pvc": {"claimName": "models", "subPath": "repo"}},
                "resources": {"gpu": 1, "cpu": "2", "gpuProduct": "NVIDIA-A30"},
                "replicas": {"min": 2, "max": 6},
                "autoscaling": {"metric": "queueTime", "targetQueueTime": "20ms"},
            },
        ),
        (
            "s3-gpu-hpa-inflight",
            {
                "resources": {"gpu": 1},
                "replicas": {"min": 1, "max": 3},
                "autoscaling": {"metric": "inflight", "targetInflight": 4},
            },
        ),
        (
            "keda-queue",
            {
                "replicas": {"min": 1, "max": 8},
                "autoscaling": {"engine": "keda"},
                "model": {
                    "name": "digits",
                    "repository": "s3://m/r",
                    "credentialsSecret": "model-store",
                },
            },
        ),
        (
            "keda-inflight",
            {
                "replicas": {"min": 1, "max": 8},
                "priority": "high",
                "autoscaling": {"engine": "keda", "metric": "inflight"},
            },
        ),
    ]
]


@pytest.mark.parametrize("spec", MATRIX)
@pytest.mark.parametrize("target", ["triton", "kserve"])
def test_matrix_renders_valid_restricted_objects(spec: dict[str, Any], target: str) -> None:
    if target == "kserve":  # serves from a PVC only (test_kserve_refuses_a_cloud_repository),
        spec = {**spec, "model": ON_PVC}  # scales on in-flight requests (test_kserve_keeps_...)
        if "autoscaling" in spec:
            spec["autoscaling"] = {**spec["autoscaling"], "metric": "inflight"}
    svc = parsed(service(**spec))
    objects = render_spec(svc, target)
    for obj in objects:
        validate_strictly(obj)
        assert obj["metadata"]["labels"]["gpufleet.dev/job"] == "digits"
        for path, pod in pod_specs_in(obj):
            assert not check_restricted(pod, path), [str(e) for e in check_restricted(pod, path)]
    if target == "kserve":
        (isvc,) = objects
        predictor = isvc["spec"]["predictor"]
        pod = {
            k: v
            for k, v in predictor.items()
            if k not in ("triton", "minReplicas", "maxReplicas", "scaleMetric", "scaleTarget")
        }
        pod["containers"] = [predictor["triton"]]
        assert not check_restricted(pod, "spec.predictor")
        assert predictor["minReplicas"] == svc.spec.replicas.min
        assert "--model-control-mode=none" in predictor["triton"]["args"]


def test_kserve_refuses_a_cloud_repository_and_mounts_a_pvc() -> None:
    """KServe fetches a cloud repository with its storage-initializer init container, which
    has no securityContext of ours (Pod Security "restricted" refuses the pods) and ignores
    model.credentialsSecret: refused in one line naming the field. A PVC is mounted directly
    (pvc:// storageUri, no init container)."""
    with pytest.raises(UserInputError) as refused:
        render_spec(parsed(service()), "kserve")
    (error,) = refused.value.errors
    assert error.path == "spec.model.repository"
    assert "storage-initializer" in error.message and "model.pvc" in error.message
    assert "target triton" in error.message
    svc = parsed(service(model={"name": "digits", "pvc": {"claimName": "models", "subPath": "r"}}))
    (isvc,) = render_spec(svc, "kserve")
    assert isvc["spec"]["predictor"]["triton"]["storageUri"] == "pvc://models/r"
    cli = CliRunner().invoke(
        app, ["render", str(REPO / "examples" / "digits-serving.yaml"), "--target", "kserve"]
    )
    assert cli.exit_code == EXIT_BAD_INPUT, cli.output
    assert "spec.model.repository" in cli.output and "Traceback" not in cli.output


def test_triton_deployment_is_locked_down_and_probed() -> None:
    svc = parsed(service(resources={"gpu": 1}))
    deployment, svc_obj, pdb = render_spec(svc, "triton")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][0] == "tritonserver"
    assert "--model-control-mode=none" in c["command"]
    assert "--strict-readiness=true" in c["command"]
    assert "--model-repository=s3://models/repo" in c["command"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["automountServiceAccountToken"] is False
    assert {p["name"]: p["port"] for p in svc_obj["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
    }
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "HorizontalPodAutoscaler" not in [o["kind"] for o in render_spec(svc)]


def test_the_gpufleet_server_runs_gpufleet_serve_from_the_pvc_on_every_address() -> None:
    """spec.server gpufleet: the same Deployment, probes and restricted pod, with `gpufleet
    serve` of the gpufleet image instead of tritonserver; its log in the pod's /tmp (the
    repository's volume is read-only). KServe runs its own Triton runtime: refused there."""
    pvc = {"name": "digits", "pvc": {"claimName": "models", "subPath": "repo"}}
    svc = parsed(service(server="gpufleet", image="localhost/gpufleet:cpu", model=pvc))
    deployment, *_ = render_spec(svc, "triton")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "localhost/gpufleet:cpu"
    assert c["command"][:2] == ["gpufleet", "serve"]
    assert "--repository=/models/repo" in c["command"]
    assert "--address=0.0.0.0" in c["command"] and "--log-file=/tmp/triton.log" in c["command"]
    assert f"--max-request-bytes={svc.spec.max_request_bytes}" in c["command"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert not check_restricted(pod, "spec.template.spec")
    assert parsed(service()).spec.server_image.startswith("nvcr.io/nvidia/tritonserver:")
    with pytest.raises(UserInputError) as refused:
        render_spec(svc, "kserve")
    assert [e.path for e in refused.value.errors] == ["spec.server"]


def test_request_size_is_bounded_on_every_serving_target() -> None:
    """Triton's --http-max-input-size (bodies, and gzip bodies once expanded) is the spec's
    maxRequestBytes on the Deployment and on KServe's Triton runtime."""
    default = parsed(service())
    (deployment, *_) = render_spec(default, "triton")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--http-max-input-size={64 << 20}" in command
    svc = parsed(service(model=ON_PVC, maxRequestBytes=2 << 20))
    (deployment, *_) = render_spec(svc, "triton")
    assert f"--http-max-input-size={2 << 20}" in deployment["spec"]["template"]["spec"][
        "containers"][0]["command"]  # fmt: skip
    (isvc,) = render_spec(svc, "kserve")
    assert f"--http-max-input-size={2 << 20}" in isvc["spec"]["predictor"]["triton"]["args"]
    with pytest.raises(UserInputError) as info:
        parsed(service(maxRequestBytes=10))
    assert [e.path for e in info.value.errors] == ["spec.maxRequestBytes"]


def test_kserve_keeps_the_users_scaling_metric_or_refuses_it() -> None:
    """KServe scales on its own signals: in-flight requests per replica becomes its
    concurrency target as asked; queue time (the default metric) used to become concurrency 8
    silently. Now it is a field error naming what KServe supports (issue 14)."""
    inflight = parsed(service(model=ON_PVC, autoscaling={"metric": "inflight",
                                                          "targetInflight": 3}))  # fmt: skip
    (isvc,) = render_spec(inflight, "kserve")
    predictor = isvc["spec"]["predictor"]
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("concurrency", 3)
    for autoscaling in ({}, {"metric": "queueTime", "targetQueueTime": "20ms"}):
        with pytest.raises(UserInputError) as refused:
            render_spec(parsed(service(model=ON_PVC, autoscaling=autoscaling)), "kserve")
        (error,) = refused.value.errors
        assert error.path == "spec.autoscaling.metric"
        assert "queueTime" in error.message and "concurrency" in error.message
        assert "metric: inflight" in error.message and "target triton" in error.message
    *_, hpa = render_spec(parsed(service(model=ON_PVC, autoscaling={})), "triton")
    assert hpa["kind"] == "HorizontalPodAutoscaler"  # triton keeps scaling on queue time


def test_pvc_repository_is_mounted_read_only() -> None:
    svc = parsed(service(model={"name": "digits", "pvc": {"claimName": "models", "subPath": "r"}}))
    deployment = render_spec(svc, "triton")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert {
        "name": "models",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in pod["volumes"]
    assert "--model-repository=/models/r" in pod["containers"][0]["command"]


def test_hpa_scales_on_the_adapter_metric() -> None:
    svc = parsed(service(replicas={"min": 1, "max": 4}, autoscaling={"targetQueueTime": "20ms"}))
    hpa = render_spec(svc, "triton")[-1]
    assert hpa["kind"] == "HorizontalPodAutoscaler"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == ADAPTER_METRICS["queueTime"]
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "20m"}  # 0.020 s
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)


@pytest.mark.parametrize("engine", ["hpa", "keda"])
def test_scale_down_waits_the_delay_the_spec_gives(engine: str) -> None:
    """Five minutes by default; a service that warms up fast may give less (the real-node
    autoscaling test does)."""

    def window(autoscaling: dict[str, Any]) -> Any:
        svc = parsed(service(replicas={"min": 1, "max": 4}, autoscaling=autoscaling))
        scaler = render_spec(svc, "triton")[-1]["spec"]
        hpa = scaler if engine == "hpa" else scaler["advanced"]["horizontalPodAutoscalerConfig"]
        return hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"]

    assert window({"engine": engine}) == 300
    assert window({"engine": engine, "scaleDownDelay": "30s"}) == 30
    assert window({"engine": engine, "scaleDownDelay": "1.5s"}) == 2  # whole seconds, not less


def test_adapter_rules_serve_the_metrics_the_hpa_names() -> None:
    served = {r["name"]["as"] for r in adapter_rules()}
    assert set(ADAPTER_METRICS.values()) <= served


BAD = [
    (
        "both sources",
        {"model": {"name": "d", "repository": "s3://a/b", "pvc": {"claimName": "x"}}},
        "spec.model",
    ),
    ("no source", {"model": {"name": "d"}}, "spec.model.repository"),
    ("not a cloud URI", {"model": {"name": "d", "repository": "/models"}}, "spec.model.repository"),
    ("max below min", {"replicas": {"min": 3, "max": 2}}, "spec.replicas.max"),
    ("range without autoscaling", {"replicas": {"min": 1, "max": 2}}, "spec.autoscaling"),
    (
        "preferred above max",
        {"batching": {"maxBatchSize": 8, "preferredBatchSizes": [16]}},
        "spec.batching.preferredBatchSizes",
    ),
    ("unknown engine", {"autoscaling": {"engine": "vpa"}}, "spec.autoscaling.engine"),
    (
        "delay above an hour",
        {"autoscaling": {"scaleDownDelay": "2h"}},
        "spec.autoscaling.scaleDownDelay",
    ),
    ("bad model name", {"model": {"name": "a b", "repository": "s3://a/b"}}, "spec.model.name"),
    ("typo", {"replica": {"min": 1}}, "spec.replica"),
    ("gpufleet server without its image", {"server": "gpufleet", "model": ON_PVC}, "spec.image"),
    (
        "gpufleet server on cloud storage",
        {"server": "gpufleet", "image": "localhost/gpufleet:cpu"},
        "spec.model.repository",
    ),
    ("unknown server", {"server": "torchserve"}, "spec.server"),
]


@pytest.mark.parametrize(("label", "spec", "path"), BAD, ids=[b[0] for b in BAD])
def test_bad_specs_exit_2_with_the_field(
    tmp_path: Path, label: str, spec: dict[str, Any], path: str
) -> None:
    with pytest.raises(UserInputError):
        validate_spec(service(**spec))
    file = tmp_path / "svc.yaml"
    file.write_text(yaml.safe_dump(service(**spec)))
    result = CliRunner().invoke(app, ["validate", str(file)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert path in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_render_picks_the_kinds_default_and_rejects_training_targets(tmp_path: Path) -> None:
    file = REPO / "examples" / "digits-serving.yaml"
    result = CliRunner().invoke(app, ["render", str(file)])
    assert result.exit_code == 0, result.output
    kinds = [d["kind"] for d in yaml.safe_load_all(result.output) if d]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
    bad = CliRunner().invoke(app, ["render", str(file), "--target", "jobset"])
    assert bad.exit_code == EXIT_BAD_INPUT and "triton, kserve" in bad.output


@pytest.mark.parametrize("engine", ["hpa", "keda"])
def test_submit_creates_every_object_through_its_client(engine: str) -> None:
    svc = parsed(service(replicas={"min": 1, "max": 2}, autoscaling={"engine": engine}))
    kube = FakeKube()
    created = kube.cluster("team-a").submit(render_spec(svc, "triton"))  # each via its own API
    assert created[:3] == ["Deployment/digits", "Service/digits", "PodDisruptionBudget/digits"]
    scaler = "create_namespaced_horizontal_pod_autoscaler"
    if engine == "keda":
        scaler = "create_namespaced_custom_object"
    assert [name for name, _ in kube.calls] == [
        "create_namespaced_deployment",
        "create_namespaced_service",
        "create_namespaced_pod_disruption_budget",
        scaler,
    ]
    assert {ns for (_, _, ns, _, _) in kube.objects} == {"team-a"}
    kserve = FakeKube()
    on_pvc = parsed(service(model=ON_PVC))
    kserve.cluster("team-a").submit(render_spec(on_pvc, "kserve"))
    assert list(kserve.objects) == [
        ("serving.kserve.io", "v1beta1", "team-a", "inferenceservices", "digits")
    ]


def serving_cluster(
    target: str = "triton", ready: int = 2, pods: list[dict[str, Any]] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> tuple[Cluster, FakeKube]:  # fmt: skip
    """A namespace holding one rendered InferenceService, ``ready`` of its replicas ready."""
    svc = parsed(service(replicas={"min": 2, "max": 4}, autoscaling={"metric": "inflight"},
                         model=ON_PVC))  # fmt: skip
    kube = FakeKube()
    for obj in render_spec(svc, target):
        if obj["kind"] == "Deployment":
            obj = {**obj, "status": {"readyReplicas": ready}}
        kube.put(obj, "team-a")
    for p in pods or []:
        kube.put(p, "team-a")
    kube.events = events or []
    return kube.cluster("team-a"), kube


def pod(phase: str, name: str = "digits-abc") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_JOB: "digits"}},
        "status": {"phase": phase},
    }


def test_status_of_a_serving_service() -> None:
    cluster, _ = serving_cluster(ready=2, pods=[pod("Running", "a"), pod("Running", "b")])
    st = cluster.status("digits")
    assert (st.kind, st.phase) == ("InferenceService/Deployment", "Serving")
    assert "2/2 replicas ready" in st.line()
    cluster, _ = serving_cluster(ready=1, pods=[pod("Running", "a"), pod("Pending", "b")])
    assert cluster.status("digits").phase == "Degraded"


def test_status_says_why_no_replica_is_ready() -> None:
    events = [
        {
            "reason": "FailedScheduling",
            "involvedObject": {"kind": "Pod", "name": "digits-abc"},
            "type": "Warning",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        }
    ]
    cluster, _ = serving_cluster(ready=0, pods=[pod("Pending")], events=events)
    st = cluster.status("digits")
    assert st.phase == "Pending"
    assert "without enough free nvidia.com/gpu" in st.line()


@pytest.mark.parametrize(
    ("target", "kinds"),
    [
        ("triton", ["HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "Deployment"]),
        ("kserve", ["InferenceService"]),
    ],
)
def test_cancel_deletes_what_the_service_rendered(target: str, kinds: list[str]) -> None:
    cluster, kube = serving_cluster(target, pods=[])
    deleted = cluster.cancel("digits")
    assert kube.deleted == deleted == [f"{k}/digits" for k in kinds]
    assert kube.objects == {}
    with pytest.raises(UserInputError, match="no gpufleet job"):
        cluster.cancel("digits")
