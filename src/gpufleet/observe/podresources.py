"""Which pod holds which GPU: the kubelet's pod-resources API (gRPC on a unix socket).

The kubelet serves ``v1.PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``
(GA since Kubernetes 1.28). ``List`` answers every pod on the node with the device IDs the
device plugin gave each container: GPU UUIDs (``GPU-...``), ``GPU-...::N`` replicas when the
NVIDIA device plugin time-slices, ``MIG-...`` for MIG slices, or indices with
``DEVICE_ID_STRATEGY=index``.

The messages are built from a descriptor here instead of generated ``_pb2`` modules: the client
needs four messages of upstream's ``api.proto`` (field numbers copied from it; fields it does not
read are skipped by protobuf's parser) and no generated file ties the package to one protobuf
gencode version. grpcio does the transport.

Pod labels (job, tenant, queue) are not in that API; ``PodLabels`` reads them from the
Kubernetes API (list pods on this node, cached) when the exporter may.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.kube import KUEUE_QUEUE_LABEL, LABEL_JOB, LABEL_QUEUE, LABEL_TENANT

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
GPU_RESOURCE_PREFIX = "nvidia.com/"

# The pod labels gpufleet's renderers set, then the labels other tools set, in order.
JOB_LABELS = (
    LABEL_JOB,
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)
QUEUE_LABELS = (LABEL_QUEUE, KUEUE_QUEUE_LABEL)


def _messages() -> dict[str, Any]:
    """Message classes for the subset of kubelet's podresources/v1/api.proto that List uses."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpufleet/kubelet_podresources_v1.proto", package="v1", syntax="proto3"
    )

    def message(name: str, *specs: tuple[str, int, int, int, str]) -> None:
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in specs:
            field = msg.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("ListPodResourcesRequest")
    message(
        "ListPodResourcesResponse", ("pod_resources", 1, F.TYPE_MESSAGE, many, ".v1.PodResources")
    )
    message(
        "PodResources",
        ("name", 1, F.TYPE_STRING, one, ""),
        ("namespace", 2, F.TYPE_STRING, one, ""),
        ("containers", 3, F.TYPE_MESSAGE, many, ".v1.ContainerResources"),
    )
    message(
        "ContainerResources",
        ("name", 1, F.TYPE_STRING, one, ""),
        ("devices", 2, F.TYPE_MESSAGE, many, ".v1.ContainerDevices"),
    )
    message(
        "ContainerDevices",
        ("resource_name", 1, F.TYPE_STRING, one, ""),
        ("device_ids", 2, F.TYPE_STRING, many, ""),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{m.name}"))
        for m in proto.message_type
    }


_MESSAGES: dict[str, Any] | None = None
_MESSAGES_LOCK = threading.Lock()


def messages() -> dict[str, Any]:
    """The message classes by name (built once)."""
    global _MESSAGES
    with _MESSAGES_LOCK:
        if _MESSAGES is None:
            _MESSAGES = _messages()
        return _MESSAGES


@dataclass(frozen=True)
class Allocation:
    """One device the kubelet gave one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str

    @property
    def gpu_id(self) -> str:
        """The physical device's ID: a time-sliced replica ``GPU-x::3`` is GPU ``GPU-x``."""
        return self.device_id.split("::", 1)[0]


class PodResourcesClient:
    """``List`` on the kubelet's socket over one gRPC channel, kept between calls (grpcio
    reconnects by itself when the kubelet restarts). Calling it returns every device of a
    resource starting with ``prefix``; it raises ``grpc.RpcError`` (a deadline included)."""

    def __init__(
        self, socket_path: str = SOCKET, *, timeout: float = 1.0, prefix: str = GPU_RESOURCE_PREFIX
    ) -> None:
        import grpc

        m = messages()
        self.timeout = timeout
        self.prefix = prefix
        self._request = m["ListPodResourcesRequest"]()
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._list = self.channel.unary_unary(
            LIST_METHOD,
            request_serializer=m["ListPodResourcesRequest"].SerializeToString,
            response_deserializer=m["ListPodResourcesResponse"].FromString,
        )

    def __call__(self) -> list[Allocation]:
        response = self._list(self._request, timeout=self.timeout)
        return [
            Allocation(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
            for pod in response.pod_resources
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name.startswith(self.prefix)
            for device_id in devices.device_ids
        ]

    def close(self) -> None:
        self.channel.close()


def list_allocations(
    socket_path: str = SOCKET, *, timeout: float = 1.0, prefix: str = GPU_RESOURCE_PREFIX
) -> list[Allocation]:
    """One ``List`` on a fresh channel (see PodResourcesClient)."""
    client = PodResourcesClient(socket_path, timeout=timeout, prefix=prefix)
    try:
        return client()
    finally:
        client.close()


@dataclass(frozen=True)
class Owner:
    """What a pod's GPUs are attributed to."""

    job_name: str
    tenant: str
    queue: str


def owner_of(namespace: str, pod_labels: Mapping[str, str] | None) -> Owner:
    """Job, tenant and queue of a pod from its labels; the tenant defaults to the namespace
    (gpufleet's chart gives each tenant a namespace), unknown job and queue are empty."""
    labels = pod_labels or {}
    job = next((labels[k] for k in JOB_LABELS if labels.get(k)), "")
    queue = next((labels[k] for k in QUEUE_LABELS if labels.get(k)), "")
    return Owner(job_name=job, tenant=labels.get(LABEL_TENANT) or namespace, queue=queue)


class PodLabels:
    """Labels of the pods on one node from the Kubernetes API, refreshed at most every
    ``refresh`` seconds. ``core`` is a ``kubernetes.client.CoreV1Api`` (needs list on pods)."""

    def __init__(self, core: Any, node: str, *, refresh: float = 30.0, timeout: float = 2.0):
        self.core = core
        self.node = node
        self.refresh = refresh
        self.timeout = timeout
        self._labels: dict[tuple[str, str], dict[str, str]] = {}
        self._fetched = -float("inf")
        self.error: str | None = None

    def get(self, now: float | None = None) -> dict[tuple[str, str], dict[str, str]]:
        now = time.monotonic() if now is None else now
        if now - self._fetched >= self.refresh:
            self._fetched = now
            try:
                pods = self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self.node}", _request_timeout=self.timeout
                )
                self._labels = {
                    (p.metadata.namespace, p.metadata.name): dict(p.metadata.labels or {})
                    for p in pods.items
                }
                self.error = None
            except Exception as exc:  # keep the last good answer; say why in the scrape
                self.error = f"{type(exc).__name__}: {exc}"[:200]
        return self._labels


class Attribution:
    """GPU allocations with owners, for the collector; every failure becomes ``ok = False``."""

    def __init__(
        self,
        lister: Callable[[], list[Allocation]],
        pod_labels: PodLabels | None = None,
    ) -> None:
        self.lister = lister
        self.pod_labels = pod_labels

    def read(self) -> tuple[list[tuple[Allocation, Owner]], str | None]:
        """(allocations with owners, None) or ([], why not)."""
        try:
            allocations = self.lister()
        except Exception as exc:
            return [], f"pod-resources: {type(exc).__name__}: {exc}"[:300]
        labels = self.pod_labels.get() if self.pod_labels else {}
        return [
            (a, owner_of(a.namespace, labels.get((a.namespace, a.pod)))) for a in allocations
        ], None
