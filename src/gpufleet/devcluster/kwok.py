"""kwok's fake nodes and the Stages that move their pods through a life with no containers:
kwok's own Stages (delays capped for tests: ``capped_pod_stages``), kwok's pod-complete Stage
for the training-operator's kinds (``owner_complete_stage``), and gpufleet's own Stage
(``stages/``), which ends a pod with the exit code its annotations name (``exit_with``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster.components import KWOK_NODE_ANNOTATION, kwok
from gpufleet.devcluster.nodes import GPU_TAINT, NodeContext, NodeSpec, node_labels
from gpufleet.devcluster.processes import Processes
from gpufleet.errors import ClusterUpError
from gpufleet.kube import Obj

STAGES = Path(__file__).with_name("stages")  # gpufleet's own kwok Stages (exit codes, deletion)
# Pod annotations for gpufleet's exit-code Stage (tests put them in pod templates).
EXIT_CODE_ANNOTATION = "gpufleet.dev/exit-code"
EXIT_AFTER_ANNOTATION = "gpufleet.dev/exit-after"  # a Go duration ("500ms"); kwok ignores "500"
NOT_KWOK_COMPLETE = {"pod-complete.stage.kwok.x-k8s.io/weight": "0"}
# Pod annotations that keep a kwok pod Running for a day (kwok's pod-complete Stage waits its
# annotated delay): a job that holds its GPUs until cancelled or preempted.
RUN_FOR_A_DAY = {
    "pod-complete.stage.kwok.x-k8s.io/delay": "24h",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "24h",
}
# Pods whose containers exit by themselves in a cluster: kwok's pod-complete Stage ends only
# those a Job owns (a Deployment's must keep running); the training-operator's kinds own their
# pods directly, and those end too. (The MPI operator's workers are not here: they run until
# its launcher, a Job, ends and the operator removes them.)
SELF_COMPLETING_OWNERS = ("PyTorchJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob")

NVIDIA_RUNTIME_CLASS: dict[str, Any] = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "nvidia"},
    "handler": "nvidia",
}


def exit_with(code: int, after_ms: int = 500) -> dict[str, str]:
    """Pod annotations that make a kwok pod end with exit ``code`` ``after_ms`` once Running."""
    return {EXIT_CODE_ANNOTATION: str(code), EXIT_AFTER_ANNOTATION: f"{after_ms}ms",
            **NOT_KWOK_COMPLETE}  # fmt: skip


def owner_complete_stage(kwok_stages: Path, directory: Path) -> Path:
    """kwok's own pod-complete Stage, for pods owned by SELF_COMPLETING_OWNERS instead of Job
    (same delays, annotations and status), written to ``directory``."""
    stage = yaml.safe_load((kwok_stages / "pod-complete.yaml").read_text())
    stage["metadata"]["name"] = "pod-complete-training-operator"
    owner_kind = [e for e in stage["spec"]["selector"]["matchExpressions"]
                  if e["key"] == ".metadata.ownerReferences.[].kind"]  # fmt: skip
    if len(owner_kind) != 1 or owner_kind[0]["values"] != ["Job"]:
        raise ClusterUpError(f"kwok's pod-complete Stage changed: {owner_kind}")
    owner_kind[0]["values"] = list(SELF_COMPLETING_OWNERS)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pod-complete-training-operator.yaml"
    path.write_text(yaml.safe_dump(stage, sort_keys=False))
    return path


def capped_pod_stages(kwok_stages: Path, directory: Path, cap_ms: int) -> Path:
    """kwok's Stages, each Pod Stage's own delay and jitter at most ``cap_ms``, written to
    ``directory``: kwok's wait 1 s plus up to 4 s more at each step of a pod's life (created,
    ready, completed), most of a short job's time. A delay a pod's annotation sets
    (RUN_FOR_A_DAY) still applies."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(kwok_stages.glob("*.yaml")):
        stage = yaml.safe_load(path.read_text())
        delay = stage["spec"].get("delay") or {}
        if stage["spec"]["resourceRef"]["kind"] == "Pod":
            for key in ("durationMilliseconds", "jitterDurationMilliseconds"):
                if key in delay:
                    delay[key] = min(delay[key], cap_ms)
        (directory / path.name).write_text(yaml.safe_dump(stage, sort_keys=False))
    return directory


def node_object(name: str, nodes: NodeSpec, index: int) -> dict[str, Any]:
    """A Node kwok manages, with its capacity (kept as created), labels and GPU taint."""
    key, value = KWOK_NODE_ANNOTATION
    capacity = {"cpu": nodes.cpu, "memory": nodes.memory, "pods": "110"}
    if nodes.gpus:
        capacity["nvidia.com/gpu"] = str(nodes.gpus)
    capacity |= dict(nodes.extra)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **node_labels(nodes, index),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {key: value}},
        "spec": {"taints": [GPU_TAINT] if nodes.gpus else []},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


@dataclass(frozen=True)
class KwokNodes:
    """Fake nodes with GPUs, managed by one kwok process: no container runs on them.
    ``pod_delay_ms`` caps kwok's delays at each step of a pod's life (capped_pod_stages)."""

    pools: list[NodeSpec]
    pod_delay_ms: int | None = None

    def objects(self) -> list[Obj]:
        """The Nodes (kwok manages those it finds annotated), and the RuntimeClass the NVIDIA
        GPU Operator installs when any has GPUs (GPU pods may name it)."""
        nodes: list[Obj] = [node_object(f"{pool.prefix}-{i}", pool, i)
                            for pool in self.pools for i in range(pool.count)]  # fmt: skip
        return nodes + ([NVIDIA_RUNTIME_CLASS] if any(p.gpus for p in self.pools) else [])

    api_address = "127.0.0.1"  # kwok runs on this host: the API server stays on loopback

    def prepare(self, directory: Path, log: Callable[[str], None]) -> None:
        """Nothing on the host: kwok's nodes are API objects."""

    def start(self, ctx: NodeContext, processes: Processes, timeout: float) -> None:
        """kwok, with its own Stages (capped when asked) and gpufleet's; ready once every node
        reports Ready."""
        kwok_stages = ctx.binaries / "kwok-stages"
        if self.pod_delay_ms is not None:
            capped = ctx.directory / "stages" / "kwok"
            kwok_stages = capped_pod_stages(kwok_stages, capped, self.pod_delay_ms)
        stages = sorted(kwok_stages.glob("*.yaml")) + sorted(STAGES.glob("*.yaml"))
        stages.append(owner_complete_stage(kwok_stages, ctx.directory / "stages"))
        count = sum(p.count for p in self.pools)
        processes.start(kwok(ctx.binaries / "kwok", ctx.kubeconfig("kwok"), stages,
                             lambda: ctx.api.nodes_ready(count)), timeout)  # fmt: skip
