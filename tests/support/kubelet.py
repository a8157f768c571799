"""A stand-in kubelet for tests: a real gRPC server on a unix socket serving the pod-resources
API from an independent transcription of upstream's api.proto (tests/fixtures/kubelet),
compiled by grpcio-tools. It answers with fields gpufleet's client does not read."""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from gpufleet.observe.devices import SimulatedDevice
from tests.support.fake_kube import FakeKube
from tests.support.paths import REPO

PROTO_DIR = REPO / "tests" / "fixtures" / "kubelet"
GPU0, GPU1 = SimulatedDevice(0).uuid, SimulatedDevice(1).uuid


@contextmanager
def compiled_upstream() -> Iterator[tuple[ModuleType, ModuleType]]:
    """podresources_v1_pb2 and _pb2_grpc, compiled from the fixture proto."""
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="gf-proto-"))
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO_DIR / "podresources_v1.proto"),
        ]
    )
    assert rc == 0
    sys.path.insert(0, str(out))
    try:
        yield (
            importlib.import_module("podresources_v1_pb2"),
            importlib.import_module("podresources_v1_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))
        shutil.rmtree(out)


def kubelet_answer(pb: ModuleType) -> Any:
    """A node with a 2-GPU training pod, a time-sliced pod, a MIG pod and a CPU-only pod."""
    numa = pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="llm-worker-0-0-abcde",
                namespace="team-a",
                containers=[
                    pb.ContainerResources(
                        name="worker",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=[GPU0, GPU1],
                                topology=numa,
                            ),
                            pb.ContainerDevices(resource_name="example.com/nic", device_ids=["n0"]),
                        ],
                        cpu_ids=[2, 3, 4],
                        memory=[pb.ContainerMemory(memory_type="memory", size=1 << 30)],
                        dynamic_resources=[
                            pb.DynamicResource(
                                claim_name="c",
                                claim_namespace="team-a",
                                claim_resources=[
                                    pb.ClaimResource(
                                        cdi_devices=[pb.CDIDevice(name="x")], driver_name="d"
                                    )
                                ],
                            )
                        ],
                    ),
                    pb.ContainerResources(name="sidecar"),
                ],
            ),
            pb.PodResources(
                name="notebook",
                namespace="team-b",
                containers=[
                    pb.ContainerResources(
                        name="lab",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=["1::0", "1::3"]
                            )
                        ],
                    )
                ],
            ),
            pb.PodResources(
                name="mig-pod",
                namespace="team-b",
                containers=[
                    pb.ContainerResources(
                        name="c",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/mig-1g.10gb", device_ids=["MIG-abc"]
                            )
                        ],
                    )
                ],
            ),
            pb.PodResources(
                name="web",
                namespace="default",
                containers=[pb.ContainerResources(name="nginx", cpu_ids=[1])],
            ),
        ]
    )


class Kubelet:
    """A stand-in kubelet serving ``List`` on a unix socket; ``delay`` makes it slow."""

    def __init__(self, upstream: tuple[ModuleType, ModuleType], answer: Any) -> None:
        _, pb_grpc = upstream
        self.answer = answer
        self.delay = 0.0
        self.calls = 0
        self.release = threading.Event()
        kubelet = self

        class Lister(pb_grpc.PodResourcesListerServicer):  # type: ignore[name-defined,misc]
            def List(self, request: Any, context: Any) -> Any:  # gRPC's method name
                kubelet.calls += 1
                if kubelet.delay:
                    kubelet.release.wait(kubelet.delay)
                return kubelet.answer

        self.dir = Path(tempfile.mkdtemp(prefix="gf-kubelet-"))
        self.socket = str(self.dir / "kubelet.sock")
        self._servicer = Lister()
        self._add = pb_grpc.add_PodResourcesListerServicer_to_server
        self.server = self._serve()

    def _serve(self) -> grpc.Server:
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self._add(self._servicer, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        return server

    def restart(self) -> None:
        """Stop and serve again on the same socket, as a restarted kubelet does."""
        self.server.stop(grace=None).wait()
        Path(self.socket).unlink(missing_ok=True)
        self.server = self._serve()

    def close(self) -> None:
        self.release.set()
        self.server.stop(grace=None)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def answering_kubelet() -> Iterator[Kubelet]:
    """A stand-in kubelet on a fresh socket, answering kubelet_answer, closed afterwards."""
    with compiled_upstream() as upstream:
        kubelet = Kubelet(upstream, kubelet_answer(upstream[0]))
        try:
            yield kubelet
        finally:
            kubelet.close()


# The API server's view of the pods the stand-in kubelet reports: their labels.
POD_LABELS = {
    ("team-a", "llm-worker-0-0-abcde"): {
        "gpufleet.dev/job": "llm",
        "gpufleet.dev/tenant": "team-a",
        "gpufleet.dev/queue": "team-a",
    },
    ("team-b", "notebook"): {"app": "jupyter"},
}


def pods_api(node: str = "n1") -> FakeKube:
    """The API server's view of the pods on ``node``, with their labels."""
    kube = FakeKube()
    for (ns, name), labels in POD_LABELS.items():
        kube.put({"apiVersion": "v1", "kind": "Pod", "spec": {"nodeName": node},
                  "metadata": {"namespace": ns, "name": name, "labels": labels}})  # fmt: skip
    return kube
