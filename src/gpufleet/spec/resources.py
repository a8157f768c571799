"""What a pod of either kind gets: per-node (or per-replica) resources and volumes."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from gpufleet.spec.names import DnsLabel, LabelKey, LabelValue
from gpufleet.spec.validation import MAX_PROCS_PER_NODE, Quantity, SpecModel


class Resources(SpecModel):
    """Per-node resources. Locally only ``gpu`` matters (it selects nccl); the rest is for pods."""

    cpu: Quantity | None = Field(default=None, description="CPU per node, e.g. '8' or '500m'.")
    memory: Quantity | None = Field(default=None, description="Memory per node, e.g. '32Gi'.")
    gpu: int = Field(
        default=0, ge=0, le=MAX_PROCS_PER_NODE, description="GPUs per node (nvidia.com/gpu)."
    )
    gpu_product: LabelValue | None = Field(
        default=None,
        description=(
            "Cluster only: run on nodes whose nvidia.com/gpu.product label (GPU feature "
            "discovery) has this value, e.g. NVIDIA-A30 or NVIDIA-H100-80GB-HBM3."
        ),
    )


class Volume(SpecModel):
    """Cluster only: a PersistentVolumeClaim mounted into every worker."""

    name: DnsLabel = Field(description="Volume name.")
    mount_path: str = Field(description="Absolute path in the container.")
    claim_name: DnsLabel = Field(description="PersistentVolumeClaim to mount.")
    read_only: bool = Field(default=False, description="Mount read-only.")

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return value


class Topology(SpecModel):
    """Cluster only: the topology domain Kueue places the job's workers in (its
    topology-aware scheduling, on a ResourceFlavor with a Topology)."""

    level: LabelKey = Field(
        description=(
            "A level of the cluster's Kueue Topology: the node label whose value every worker "
            "shares, e.g. topology.gpufleet.dev/rack (the chart's racks) or "
            "kubernetes.io/hostname."
        )
    )
    required: bool = Field(
        default=True,
        description=(
            "true: the job waits until its workers fit in one domain of that level; false: "
            "Kueue prefers one, and else spreads them over as few as it can."
        ),
    )


# The RDMA device plugin's resource (k8s-rdma-shared-dev-plugin, as NVIDIA's Network Operator
# installs it); the chart's `rdma.resourceName` defaults to the same.
# Every RDMA device resource is under RDMA_RESOURCE_PREFIX (the shared device plugin's own
# naming): Kueue's quota skips that prefix (the chart's kueue-config.yaml) and doctor looks
# for it on the nodes.
RDMA_RESOURCE_PREFIX = "rdma/"
DEFAULT_RDMA_RESOURCE = RDMA_RESOURCE_PREFIX + "rdma_shared_device_a"
_NETWORK = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RESOURCE = re.compile(r"^rdma/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class Rdma(SpecModel):
    """Cluster only: the InfiniBand (RDMA) network the workers' NCCL traffic takes, attached by
    Multus beside the pods' own (Ethernet) network, which keeps Kubernetes' traffic."""

    network: str = Field(
        description=(
            "The NetworkAttachmentDefinition Multus attaches (its name in the job's namespace, "
            "or namespace/name), e.g. ib-net."
        )
    )
    resource: str = Field(
        default=DEFAULT_RDMA_RESOURCE,
        description="The RDMA device plugin's extended resource, one per worker pod.",
    )
    hca: str = Field(
        default="mlx5",
        pattern=r"^[=^]?[A-Za-z0-9_:,-]+$",
        description="NCCL_IB_HCA: the InfiniBand adapters NCCL uses (a prefix matches: mlx5).",
    )
    socket_ifname: str = Field(
        default="eth0",
        pattern=r"^[=^]?[A-Za-z0-9_.,-]+$",
        description=(
            "NCCL_SOCKET_IFNAME: the pods' own (Ethernet) interface, for NCCL's bootstrap."
        ),
    )

    @field_validator("network")
    @classmethod
    def _network(cls, value: str) -> str:
        if not _NETWORK.match(value) or len(value) > 253:
            raise ValueError(f"must be a NetworkAttachmentDefinition name or namespace/name, "
                             f"got {value!r}")  # fmt: skip
        return value

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        if not _RESOURCE.match(value):
            raise ValueError(f"must be an RDMA device resource, {RDMA_RESOURCE_PREFIX}<name> (the "
                             f"prefix Kueue's quota skips), got {value!r}")  # fmt: skip
        return value
