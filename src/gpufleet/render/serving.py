"""InferenceService -> Kubernetes: Triton as a Deployment (target ``triton``) or a KServe
InferenceService (target ``kserve``).

``triton``: a Deployment of the official Triton image (``--model-repository`` on a PVC or cloud
storage, ``--model-control-mode=none`` so nobody loads or unloads models, strict readiness,
non-root under the restricted Pod Security profile), a Service (HTTP 8000, gRPC 8001, metrics
8002), a PodDisruptionBudget, and with ``spec.autoscaling`` a HorizontalPodAutoscaler on a
per-pod custom metric (Prometheus Adapter) or a KEDA ScaledObject (Prometheus trigger).
"""

from __future__ import annotations

import copy
import math

from gpufleet.errors import FieldError, UserInputError
from gpufleet.kube import LABEL_JOB, LABEL_ROLE, ROLE_SERVER, Obj
from gpufleet.observe.tls import CERT_FILE as TLS_CERT
from gpufleet.observe.tls import KEY_FILE as TLS_KEY
from gpufleet.render.meta import metadata, standard_labels
from gpufleet.render.podspec import (
    CONTAINER_SECURITY,
    POD_SECURITY,
    SECRETS_ROOT,
    gpu_placement,
    resource_quantities,
    scrape_annotations,
)
from gpufleet.spec.inference import InferenceService

HTTP, GRPC, METRICS = 8000, 8001, 8002
MODELS = "/models"
# Per-pod metrics that Prometheus Adapter serves from Triton's own
# (deploy/prometheus/adapter-rules.yaml).
ADAPTER_METRICS = {
    "queueTime": "gpufleet_triton_queue_seconds_per_request",
    "inflight": "gpufleet_triton_pending_requests",
}


def labels(svc: InferenceService) -> dict[str, str]:
    """gpufleet's standard labels (job = the service, so the exporter attributes its GPUs)."""
    return standard_labels(svc.metadata, "inference", "server")


def _meta(svc: InferenceService) -> Obj:
    return metadata(svc, labels(svc))


def _selector(svc: InferenceService) -> dict[str, str]:
    return {LABEL_JOB: svc.metadata.name, LABEL_ROLE: ROLE_SERVER}


def _resources(svc: InferenceService) -> Obj:
    out = resource_quantities(svc.spec.resources)
    return {"requests": out, "limits": dict(out)} if out else {}


def triton_args(svc: InferenceService) -> list[str]:
    """tritonserver's command line for ``svc``."""
    m = svc.spec.model
    repository = m.repository or f"{MODELS}/{m.pvc.sub_path}".rstrip("/")  # type: ignore[union-attr]
    return [
        "tritonserver",
        f"--model-repository={repository}",
        "--model-control-mode=none",  # no load/unload over the API
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--http-max-input-size={svc.spec.max_request_bytes}",  # bodies, expanded gzip too
        f"--http-port={HTTP}",
        f"--grpc-port={GRPC}",
        f"--metrics-port={METRICS}",
        "--allow-metrics=true",
        f"--allow-gpu-metrics={'true' if svc.spec.resources.gpu else 'false'}",
    ]


def gpufleet_serve_args(svc: InferenceService) -> list[str]:
    """``gpufleet serve``'s command line for ``svc`` (spec.server gpufleet): on every address
    of the pod, Triton's ports, its log in the pod's /tmp (the repository is read-only)."""
    assert svc.spec.model.pvc is not None  # the spec's rule for server gpufleet
    return [
        "gpufleet",
        "serve",
        f"--repository={MODELS}/{svc.spec.model.pvc.sub_path}".rstrip("/"),
        "--address=0.0.0.0",
        f"--http-port={HTTP}",
        f"--grpc-port={GRPC}",
        f"--metrics-port={METRICS}",
        f"--max-request-bytes={svc.spec.max_request_bytes}",
        "--log-file=/tmp/triton.log",
        *_tls_args(svc),
    ]


def _tls_args(svc: InferenceService) -> list[str]:
    """spec.tls: the mounted Secret's certificate and key (pod_spec mounts it)."""
    if svc.spec.tls is None:
        return []
    where = f"{SECRETS_ROOT}/{svc.spec.tls.secret_name}"
    return [f"--tls-cert={where}/{TLS_CERT}", f"--tls-key={where}/{TLS_KEY}"]


def pod_spec(svc: InferenceService) -> Obj:
    """Triton's PodSpec: restricted Pod Security, probes on Triton's health API."""
    s = svc.spec
    scheme = {"scheme": "HTTPS"} if s.tls else {}  # the kubelet's probes verify no certificate
    http = {"path": "/v2/health/ready", "port": "http", **scheme}
    container: Obj = {
        "name": "triton",
        "image": s.server_image,
        "imagePullPolicy": "IfNotPresent",
        "command": triton_args(svc) if s.server == "triton" else gpufleet_serve_args(svc),
        "ports": [
            {"name": "http", "containerPort": HTTP},
            {"name": "grpc", "containerPort": GRPC},
            {"name": "metrics", "containerPort": METRICS},
        ],
        "readinessProbe": {"httpGet": http, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": "http", **scheme},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # Models load before the server is ready; big ones take minutes.
        "startupProbe": {"httpGet": dict(http), "periodSeconds": 10, "failureThreshold": 60},
        "resources": _resources(svc),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    volumes: list[Obj] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if s.model.pvc:
        container["volumeMounts"].append({"name": "models", "mountPath": MODELS, "readOnly": True})
        volumes.append(
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": s.model.pvc.claim_name, "readOnly": True},
            }
        )
    if s.model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": s.model.credentials_secret}}]
    if s.tls:  # the certificate and key alone, for the pod's group (fsGroup)
        where = f"{SECRETS_ROOT}/{s.tls.secret_name}"  # as every Secret gpufleet reads
        container["volumeMounts"].append({"name": "tls", "mountPath": where, "readOnly": True})
        items = [{"key": k, "path": k} for k in (TLS_CERT, TLS_KEY)]
        secret = {"secretName": s.tls.secret_name, "items": items, "defaultMode": 0o440}
        volumes.append({"name": "tls", "secret": secret})
    spec: Obj = {
        "securityContext": copy.deepcopy(POD_SECURITY),
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    if s.priority:
        spec["priorityClassName"] = s.priority
    spec.update(gpu_placement(s.resources))
    return spec


def render_triton(svc: InferenceService) -> list[Obj]:
    """Deployment, Service, PodDisruptionBudget, and the autoscaler if the spec asks for one."""
    name = svc.metadata.name
    s = svc.spec
    deployment: Obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(svc),
        "spec": {
            "replicas": s.replicas.min,
            "selector": {"matchLabels": _selector(svc)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": labels(svc),
                    "annotations": scrape_annotations(METRICS),
                },
                "spec": pod_spec(svc),
            },
        },
    }
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(svc),
        "spec": {
            "selector": _selector(svc),
            "ports": [
                {"name": n, "port": p, "targetPort": n}
                for n, p in (("http", HTTP), ("grpc", GRPC), ("metrics", METRICS))
            ],
        },
    }
    # One replica at a time may go (drains, upgrades); never all of a multi-replica service.
    pdb: Obj = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(svc),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(svc)}},
    }
    out = [deployment, service, pdb]
    if s.autoscaling is not None:
        out.append(_keda(svc, name) if s.autoscaling.engine == "keda" else _hpa(svc, name))
    return out


def _target(svc: InferenceService) -> tuple[str, float]:
    a = svc.spec.autoscaling
    assert a is not None
    if a.metric == "queueTime":
        return ADAPTER_METRICS["queueTime"], a.target_queue_time
    return ADAPTER_METRICS["inflight"], float(a.target_inflight)


def _quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as is, fractions in milli-units."""
    return str(int(value)) if value == int(value) else f"{math.ceil(value * 1000)}m"


def _hpa(svc: InferenceService, name: str) -> Obj:
    metric, target = _target(svc)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(svc),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": svc.spec.replicas.min,
            "maxReplicas": svc.spec.replicas.max,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric},
                        "target": {"type": "AverageValue", "averageValue": _quantity(target)},
                    },
                }
            ],
            "behavior": _behavior(svc),
        },
    }


def _behavior(svc: InferenceService) -> Obj:
    """Scale up at once (the HPA's default), down after spec.autoscaling.scaleDownDelay."""
    assert svc.spec.autoscaling is not None
    window = math.ceil(svc.spec.autoscaling.scale_down_delay)
    return {"scaleDown": {"stabilizationWindowSeconds": window}}


def _keda(svc: InferenceService, name: str) -> Obj:
    a = svc.spec.autoscaling
    assert a is not None
    ns = svc.metadata.namespace or "default"
    sel = f'namespace="{ns}",pod=~"{name}-.*"'
    if a.metric == "queueTime":  # the service's mean queue time per request, seconds
        query = (
            f"sum(rate(nv_inference_queue_duration_us{{{sel}}}[1m])) / 1e6 / "
            f"clamp_min(sum(rate(nv_inference_request_success{{{sel}}}[1m])), 1e-9)"
        )
        threshold = a.target_queue_time
        metric_type = "Value"  # compared as a whole, not divided by replicas
    else:  # pending requests summed over pods, divided by replicas by KEDA
        query = f"sum(nv_inference_pending_request_count{{{sel}}})"
        threshold = float(a.target_inflight)
        metric_type = "AverageValue"
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(svc),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": svc.spec.replicas.min,
            "maxReplicaCount": svc.spec.replicas.max,
            # the HPA that KEDA makes paces scale-down; cooldownPeriod only the last replica
            "cooldownPeriod": math.ceil(a.scale_down_delay),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(svc)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": metric_type,
                    "metadata": {
                        "serverAddress": a.prometheus_url,
                        "query": query,
                        "threshold": f"{threshold:g}",
                    },
                }
            ],
        },
    }


def kserve_errors(svc: InferenceService) -> list[FieldError]:
    """What target kserve cannot serve in a tenant namespace. For any storageUri but pvc://,
    KServe's pod webhook adds a ``storage-initializer`` init container (pkg/webhook/admission/
    pod/storage_initializer_injector.go) whose securityContext is only what the cluster's
    ClusterStorageContainer sets (none in KServe's own default), so Pod Security "restricted"
    refuses every pod (no allowPrivilegeEscalation: false, no capabilities drop ALL), and the
    download reads KServe's storage credentials, not ``model.credentialsSecret``. A pvc://
    source is mounted into the server container directly, with no init container."""
    errors = []
    if svc.spec.server != "triton":
        errors.append(FieldError("spec.server", (
            "target kserve runs KServe's Triton runtime (the official image); `gpufleet "
            "serve` (server gpufleet) is for target triton")))  # fmt: skip
    if svc.spec.model.pvc is None:
        errors.append(FieldError("spec.model.repository", (
            "target kserve downloads a cloud repository with KServe's storage-initializer init "
            "container, which Pod Security 'restricted' (every tenant namespace) refuses and "
            "which ignores model.credentialsSecret; use model.pvc, or target triton (Triton "
            f"reads {svc.spec.model.repository} itself)")))  # fmt: skip
    a = svc.spec.autoscaling
    # KServe's autoscaler reads its own signals (the predictor's scaleMetric), not Triton's
    # metrics: in-flight requests per replica maps one to one, queue time does not map at all.
    if a is not None and a.metric != "inflight":
        errors.append(FieldError("spec.autoscaling.metric", (
            f"target kserve cannot scale on {a.metric}: KServe scales on concurrency (requests "
            "in flight per replica), cpu, memory or rps; use metric: inflight with "
            "targetInflight, or target triton (it scales on Triton's queue time)")))  # fmt: skip
    return errors


def render_kserve(svc: InferenceService) -> list[Obj]:
    """A KServe InferenceService (serving.kserve.io/v1beta1) with a Triton predictor, serving a
    repository on a PVC (kserve_errors says why only that)."""
    errors = kserve_errors(svc)
    if errors:
        raise UserInputError(errors)
    s = svc.spec
    m = s.model
    assert m.pvc is not None  # kserve_errors
    predictor: Obj = {
        "minReplicas": s.replicas.min,
        "maxReplicas": s.replicas.max,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "automountServiceAccountToken": False,
        "triton": {
            "storageUri": f"pvc://{m.pvc.claim_name}/{m.pvc.sub_path}".rstrip("/"),
            "runtimeVersion": s.server_image.rsplit(":", 1)[-1],
            "args": [
                "--model-control-mode=none",
                "--strict-readiness=true",
                f"--http-max-input-size={s.max_request_bytes}",
            ],
            "resources": _resources(svc),
            "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        },
    }
    a = s.autoscaling
    if a is not None:  # metric inflight (kserve_errors): KServe's concurrency per replica
        predictor["scaleMetric"] = "concurrency"
        predictor["scaleTarget"] = a.target_inflight
    predictor.update(gpu_placement(s.resources))
    if s.priority:
        predictor["priorityClassName"] = s.priority
    return [
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": _meta(svc),
            "spec": {"predictor": predictor},
        }
    ]
