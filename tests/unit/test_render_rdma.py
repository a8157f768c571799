"""spec.rdma: every target's workers join the InfiniBand network (Multus), request one RDMA
device, add IPC_LOCK and point NCCL at the adapters; nothing else changes, and the pods pass
"restricted" but for IPC_LOCK."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.cluster.admission import adds_rdma_capability
from gpufleet.errors import UserInputError
from gpufleet.kube import MULTUS_NETWORKS, ROLE_WORKER
from gpufleet.render import FRAMEWORK_TARGETS, check_restricted, pod_specs_in, render
from gpufleet.render.podsecurity import RDMA_CAPABILITY
from gpufleet.spec import DEFAULT_RDMA_RESOURCE, validate_training_job
from tests.support.specs import cluster_job
from tests.unit.test_render_topology import templates

TARGETS = [t for ts in FRAMEWORK_TARGETS.values() for t in ts]
RDMA = {"network": "ib-net", "hca": "mlx5_0,mlx5_1"}


def rendered(target: str, rdma: dict[str, Any] | None = RDMA) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {"nodes": 2, "resources": {"gpu": 1}}
    if rdma is not None:
        spec["rdma"] = rdma
    doc = cluster_job(target, **spec)
    if target not in ("tfjob", "rayjob"):
        doc["spec"]["procsPerNode"] = 1
    return render(validate_training_job(doc), target)


@pytest.mark.parametrize("target", TARGETS)
def test_workers_join_the_network_with_a_device_and_ipc_lock_and_nothing_else_does(
    target: str,
) -> None:
    for obj, template in ((o, t) for o in rendered(target) for t in templates(o)):
        role = template["metadata"]["labels"]["gpufleet.dev/role"]
        annotations = template["metadata"].get("annotations") or {}
        (container,) = template["spec"]["containers"]
        added = container["securityContext"]["capabilities"].get("add", [])
        # A TrainJob's env and resources are its trainer's (the runtime patch has neither).
        own = obj["spec"]["trainer"] if target == "trainjob" else container
        env = {e["name"]: e.get("value") for e in own.get("env") or []}
        resources = own.get("resourcesPerNode" if target == "trainjob" else "resources") or {}
        if role != ROLE_WORKER:  # an MPI launcher, a Ray head: not in the collectives
            assert MULTUS_NETWORKS not in annotations and not added and "NCCL_IB_HCA" not in env
            continue
        assert annotations[MULTUS_NETWORKS] == "ib-net"
        assert added == [RDMA_CAPABILITY]
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        for kind in ("requests", "limits"):
            assert resources[kind][DEFAULT_RDMA_RESOURCE] == "1"


@pytest.mark.parametrize("target", TARGETS)
def test_rdma_pods_pass_restricted_but_for_ipc_lock(target: str) -> None:
    objects = rendered(target)
    assert all(adds_rdma_capability(o) for o in objects if list(pod_specs_in(o)))
    for obj in objects:
        for path, pod in pod_specs_in(obj):
            if target == "trainjob":  # the Trainer gives the patched container its resources
                (container,) = pod["containers"]
                container["resources"] = obj["spec"]["trainer"]["resourcesPerNode"]
            assert not check_restricted(pod, path, rdma_device=DEFAULT_RDMA_RESOURCE)
            plain = check_restricted(pod, path)
            assert all(e.path.endswith("capabilities.add") for e in plain), plain
    assert not any(adds_rdma_capability(o) for o in rendered(target, rdma=None))


@pytest.mark.parametrize(
    ("rdma", "path"),
    [
        ({"network": "IB_NET"}, "spec.rdma.network"),
        ({"network": "a/b/c"}, "spec.rdma.network"),
        ({"network": "ib", "resource": "no-domain"}, "spec.rdma.resource"),
        ({"network": "ib", "resource": "nvidia.com/gpu"}, "spec.rdma.resource"),
        ({"network": "ib", "hca": "mlx5 0"}, "spec.rdma.hca"),
        ({}, "spec.rdma.network"),
    ],
)
def test_a_bad_rdma_field_is_refused_with_its_path(rdma: dict[str, Any], path: str) -> None:
    with pytest.raises(UserInputError) as refused:
        validate_training_job(cluster_job(rdma=rdma))
    assert [e.path for e in refused.value.errors] == [path]


def test_a_network_of_another_namespace_is_multus_form() -> None:
    job = validate_training_job(cluster_job(rdma={"network": "net-system/ib-net"}))
    assert job.spec.rdma is not None and job.spec.rdma.network == "net-system/ib-net"


def test_the_spec_env_wins_over_the_rdma_nccl_defaults() -> None:
    doc = cluster_job(rdma=RDMA, env={"NCCL_SOCKET_IFNAME": "bond0"})
    (pod,) = templates(render(validate_training_job(doc), "jobset"))
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.count("NCCL_SOCKET_IFNAME") == 1  # a JobSet's env is a list keyed by name
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "bond0" and env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"


def test_ipc_lock_passes_the_check_only_beside_the_device() -> None:
    (pod,) = templates(render(validate_training_job(cluster_job(rdma=RDMA)), "jobset"))
    pod["spec"]["containers"][0]["resources"]["limits"].pop(DEFAULT_RDMA_RESOURCE)
    errors = check_restricted(pod["spec"], rdma_device=DEFAULT_RDMA_RESOURCE)
    assert [e.path for e in errors] == ["spec.containers[0].securityContext.capabilities.add"]
