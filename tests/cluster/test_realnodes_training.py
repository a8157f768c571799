"""The digits job trained across real nodes: the project's image (built here, imported into
each node) in pods that pass `restricted`, queued by Kueue with the chart's lab values,
meeting over the headless Service's DNS names, checkpointing as UID 1000 to a shared
PersistentVolumeClaim, and ending with the very weights a local `gpufleet run` of the same
job ends with (its state digest, from rank 0's log through `gpufleet logs`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.realnodes.storage import STORAGE_CLASS
from tests.support.cli import run_cli
from tests.support.devcluster import CHART, DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import project_image
from tests.support.specs import digits_job, write_spec

# The first test here may start the real-node cluster: importing a new image into both nodes
# takes minutes on 2 cores (test setup counts toward the timeout).
pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip
TENANT = "research"
CLAIM = "ckpt"
DIGEST = re.compile(r"state digest ([0-9a-f]{16,})")
WORKLOAD = {"name": "digits", "steps": 40, "batchSize": 32, "logEvery": 10}


@pytest.fixture(scope="module")
def reallab(realcluster: DevCluster) -> Iterator[DevCluster]:
    """The chart with the lab's values (the NVML exporter left out: no GPU here) and a shared
    claim for checkpoints in the research tenant."""
    values = CHART / "ci" / "lab-3node-a30-values.yaml"
    realcluster.helm("install", "lab", str(CHART), "-f", str(values), "-n", "gpufleet-system",
                     "--set", "monitoring.exporter.enabled=false", "--create-namespace",
                     "--wait", "--timeout", "120s")  # fmt: skip
    realcluster.core.create_namespaced_persistent_volume_claim(TENANT, {
        "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    try:
        yield realcluster
    finally:
        realcluster.core.delete_namespaced_persistent_volume_claim(CLAIM, TENANT)
        realcluster.helm("uninstall", "lab", "-n", "gpufleet-system", "--wait")


def local_digest(root: Path, name: str, nodes: int, procs: int, steps: int = 40) -> str:
    """The state digest of the same job run here by `gpufleet run` (same world, same data)."""
    workload = {**WORKLOAD, "steps": steps}
    doc = digits_job(name, workload=workload, nodes=nodes, procsPerNode=procs,
                     checkpoint={"dir": str(root / name / "ckpt"), "everySteps": 10})  # fmt: skip
    run = run_cli("run", str(write_spec(root, doc, f"{name}.yaml")), "-o", "json", cwd=root,
                  timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return str(json.loads(run.stdout)["state_digest"])


def real_job(name: str, nodes: int, procs: int) -> dict[str, Any]:
    volume = {"name": "ckpt", "mountPath": "/ckpt", "claimName": CLAIM}
    doc = digits_job(name, workload=WORKLOAD, nodes=nodes, procsPerNode=procs,
                     resources={"gpu": procs}, queue=TENANT, image=project_image()[0],
                     checkpoint={"dir": f"/ckpt/{name}", "everySteps": 10},
                     volumes=[volume])  # fmt: skip
    doc["metadata"]["namespace"] = TENANT
    return doc


def digests_in_logs(cluster: DevCluster, name: str) -> list[str]:
    logs = cluster.gpufleet("logs", name, "-n", TENANT)
    assert logs.returncode == 0, logs.stderr[-2000:]
    return DIGEST.findall(logs.stdout)


@pytest.mark.parametrize(("target", "nodes", "procs"),
                         [("job", 2, 1), ("jobset", 2, 1), ("job", 2, 2)])  # fmt: skip
def test_digits_across_real_nodes_ends_with_the_local_runs_weights(
    reallab: DevCluster, target: str, nodes: int, procs: int
) -> None:
    name = f"digits-{target}-{nodes}x{procs}"
    path = write_spec(reallab.root, real_job(name, nodes, procs), f"{name}.yaml")
    submit = reallab.gpufleet("submit", str(path), "--target", target)
    assert submit.returncode == 0, submit.stderr[-2000:]
    phase, pods = reallab.run_to_end(name, TENANT, timeout=300)
    assert phase == "Succeeded", reallab.gpufleet("logs", name, "-n", TENANT).stdout[-3000:]
    placed = {p["spec"]["nodeName"] for p in pods.values()}
    assert len(placed) == nodes and all(n.startswith("real-") for n in placed), placed
    assert digests_in_logs(reallab, name) == [local_digest(reallab.root, name, nodes, procs)]
    status = reallab.gpufleet("status", name, "-n", TENANT)
    assert status.returncode == 0 and "Succeeded" in status.stdout, status.stdout
    written = list((reallab.dir / "volumes").glob(f"pv-*/{name}/*"))
    assert written, "no checkpoint on the shared volume"
    assert all(p.stat().st_uid == 1000 for p in written), [(p, p.stat().st_uid) for p in written]
    cancel = reallab.gpufleet("cancel", name, "-n", TENANT)
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    poll_until(lambda: not reallab.pods(TENANT, name), what=f"{name}'s pods gone", timeout=60)
