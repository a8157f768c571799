"""Kind ``InferenceService``: a Triton model repository served on Kubernetes, with autoscaling."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from gpufleet.spec.names import API_VERSION, DnsLabel, Metadata, ObjectRefName
from gpufleet.spec.resources import Resources
from gpufleet.spec.validation import (
    INT32_MAX,
    CrossFieldModel,
    Duration,
    Problem,
    SpecModel,
    raw_int,
)

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.10-py3"
# A Triton model name (its directory in the repository); `gpufleet export` checks the same.
MODEL_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
# Dynamic batching defaults, for the spec, `gpufleet export` and the repository writer alike.
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_PREFERRED_BATCH_SIZES = (16, 32, 64)
DEFAULT_MAX_QUEUE_DELAY_US = 500
# Schemes Triton's --model-repository reads itself (cloud storage), besides a PVC path.
REPOSITORY_SCHEMES = ("s3://", "gs://", "as://")


def _model_name(value: str) -> str:
    if not MODEL_NAME.match(value):
        raise ValueError(f"1-63 letters, digits, '_', '.' or '-', got {value!r}")
    return value


def _repository(value: str) -> str:
    if not value.startswith(REPOSITORY_SCHEMES):
        raise ValueError(
            f"a cloud storage URI Triton reads ({', '.join(REPOSITORY_SCHEMES)}...), got "
            f"{value!r}; for a volume use model.pvc"
        )
    return value


def preferred_out_of_range(preferred: list[int] | tuple[int, ...], max_batch: int) -> list[int]:
    """Preferred batch sizes outside 1..max_batch (Triton rejects them)."""
    return [size for size in preferred if not 0 < size <= max_batch]


class PvcSource(SpecModel):
    """A PersistentVolumeClaim holding the model repository."""

    claim_name: DnsLabel = Field(description="The claim's name, in the service's namespace.")
    sub_path: str = Field(default="", description="The repository's directory in the volume.")


class ModelSource(CrossFieldModel):
    """Which model, from which repository (exactly one of ``repository`` and ``pvc``)."""

    name: Annotated[str, AfterValidator(_model_name)] = Field(
        description="The model's directory in the repository (as `gpufleet export` wrote it)."
    )
    repository: Annotated[str, AfterValidator(_repository)] | None = Field(
        default=None, description="A cloud storage URI, e.g. s3://bucket/models."
    )
    pvc: PvcSource | None = Field(default=None, description="Or a volume holding the repository.")
    credentials_secret: DnsLabel | None = Field(
        default=None,
        description=(
            "A Secret whose keys become Triton's environment (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, ...) for a cloud repository."
        ),
    )

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        if (data.get("repository") is None) == (data.get("pvc") is None):
            return [(("repository",), "set exactly one of model.repository (a URI) and model.pvc")]
        return []


class Replicas(SpecModel):
    """How many Triton pods: autoscaling moves between min and max."""

    min: int = Field(default=1, ge=1, le=INT32_MAX, description="Fewest replicas.")
    max: int = Field(default=1, ge=1, le=INT32_MAX, description="Most replicas.")


class ServingBatching(SpecModel):
    """Dynamic batching as `gpufleet export --service` writes it into config.pbtxt."""

    max_batch_size: int = Field(
        default=DEFAULT_MAX_BATCH_SIZE, ge=0, description="Largest batch (0: none)."
    )
    preferred_batch_sizes: list[int] = Field(
        default_factory=lambda: list(DEFAULT_PREFERRED_BATCH_SIZES),
        description="Batch sizes the batcher aims for.",
    )
    max_queue_delay: Duration = Field(
        default=DEFAULT_MAX_QUEUE_DELAY_US / 1e6,
        description="Longest a request waits for a batch to fill, e.g. 500us.",
    )


class Autoscaling(SpecModel):
    """Scale on a serving signal from Triton's metrics (not CPU)."""

    engine: Literal["hpa", "keda"] = Field(
        default="hpa",
        description=(
            "hpa: a HorizontalPodAutoscaler on a per-pod custom metric served by Prometheus "
            "Adapter (rules in deploy/prometheus/adapter-rules.yaml); keda: a KEDA "
            "ScaledObject with a Prometheus trigger."
        ),
    )
    metric: Literal["queueTime", "inflight"] = Field(
        default="queueTime",
        description=(
            "queueTime: mean time requests wait in Triton's queue; inflight: requests "
            "pending per replica."
        ),
    )
    target_queue_time: Duration = Field(
        default=0.02, description="queueTime: the mean queue time to hold, e.g. 20ms."
    )
    target_inflight: int = Field(default=8, ge=1, description="inflight: requests per replica.")
    scale_down_delay: Duration = Field(
        default=300.0,
        ge=0,
        le=3600,
        description=(
            "How long the signal must stay below its target before replicas are removed (the "
            "autoscaler's scale-down stabilization window), e.g. 5m; at most 1h. Scale-up is at "
            "once; a model's warm-up costs more than an idle replica."
        ),
    )
    prometheus_url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        description="keda: the Prometheus its trigger queries.",
    )


class ServingTls(SpecModel):
    """HTTPS and gRPC over TLS for the served model (server gpufleet)."""

    secret_name: ObjectRefName = Field(
        description=(
            "A Secret of type kubernetes.io/tls (tls.crt, tls.key), mounted read-only into the "
            "server pods: `gpufleet serve --tls-cert --tls-key` (the guard terminates HTTPS, "
            "Triton's own flags secure gRPC). Triton's metrics port stays plain HTTP."
        ),
    )


class InferenceServiceSpec(CrossFieldModel):
    """What to serve and how."""

    model: ModelSource = Field(description="The model and its repository.")
    server: Literal["triton", "gpufleet"] = Field(
        default="triton",
        description=(
            "triton: tritonserver of the official Triton image. gpufleet: `gpufleet serve` in "
            "gpufleet's own image (PyTriton's Triton, the repository's TorchScript models run "
            "by torch), for target triton with the repository on a PVC: no NVIDIA image "
            "needed, and the image the training jobs already run."
        ),
    )
    image: str | None = Field(
        default=None,
        description=f"The server's image (server triton: default {TRITON_IMAGE}; server "
        "gpufleet: required, the gpufleet image).",
    )
    replicas: Replicas = Field(default_factory=Replicas, description="Replica range.")
    resources: Resources = Field(default_factory=Resources, description="Per replica.")
    batching: ServingBatching = Field(
        default_factory=ServingBatching, description="Dynamic batching."
    )
    max_request_bytes: int = Field(
        default=64 << 20,
        ge=1024,
        le=2**31 - 1,
        description=(
            "Largest HTTP request body Triton accepts, after gzip/deflate too "
            "(--http-max-input-size; Triton's own default, 64 MiB)."
        ),
    )
    autoscaling: Autoscaling | None = Field(
        default=None, description="Required when replicas.max > replicas.min."
    )
    priority: DnsLabel | None = Field(
        default=None, description="A PriorityClass for the Triton pods."
    )
    tls: ServingTls | None = Field(
        default=None, description="Serve over TLS only (HTTPS, gRPC with TLS); server gpufleet."
    )

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        problems: list[Problem] = []
        low = raw_int(data, "replicas", "min", default=1, minimum=1)
        high = raw_int(data, "replicas", "max", default=1, minimum=1)
        if low and high and high < low:
            problems.append((("replicas", "max"), f"{high} is below spec.replicas.min ({low})"))
        elif low and high and high > low and data.get("autoscaling") is None:
            problems.append(
                (
                    ("autoscaling",),
                    f"required when spec.replicas.max ({high}) > min ({low}): what to scale "
                    "on; or set max = min",
                )
            )
        if data.get("server") == "gpufleet":
            problems += _gpufleet_server_problems(data)
        elif data.get("tls") is not None:
            problems.append((("tls",), "needs spec.server gpufleet: tritonserver's own HTTP "
                             "endpoint has no TLS (only its gRPC has); `gpufleet serve` "
                             "terminates HTTPS in its guard"))  # fmt: skip
        max_batch = raw_int(data, "batching", "maxBatchSize", default=DEFAULT_MAX_BATCH_SIZE)
        batching = data.get("batching")
        preferred = (batching if isinstance(batching, dict) else {}).get(
            "preferredBatchSizes", list(DEFAULT_PREFERRED_BATCH_SIZES)
        )
        if isinstance(preferred, list) and all(type(p) is int for p in preferred):
            bad = preferred_out_of_range(preferred, max_batch or 0)
            if max_batch and bad:
                problems.append(
                    (
                        ("batching", "preferredBatchSizes"),
                        f"{bad} not within 1..spec.batching.maxBatchSize ({max_batch})",
                    )
                )
        return problems

    @property
    def server_image(self) -> str:
        """The image the server runs."""
        return self.image or TRITON_IMAGE


def _gpufleet_server_problems(data: dict[str, Any]) -> list[Problem]:
    """`gpufleet serve` needs its image named and reads a repository from a volume."""
    problems: list[Problem] = []
    if not data.get("image"):
        problems.append((("image",), "required with spec.server gpufleet: the gpufleet image "
                         "(`make image` builds one)"))  # fmt: skip
    model = data.get("model")
    if isinstance(model, dict) and model.get("repository"):
        problems.append((("model", "repository"), "spec.server gpufleet serves a repository "
                         "on a PVC (model.pvc); cloud storage needs server triton"))  # fmt: skip
    return problems


class InferenceService(SpecModel):
    """A model served by Triton on Kubernetes (kind InferenceService)."""

    api_version: Literal["gpufleet.dev/v1alpha1"] = Field(description="Always " + API_VERSION)
    kind: Literal["InferenceService"] = Field(description="Always InferenceService.")
    metadata: Metadata = Field(description="Name, namespace and labels.")
    spec: InferenceServiceSpec = Field(description="What to serve and how.")
