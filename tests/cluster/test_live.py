"""Against a live cluster (KUBECONFIG set; skipped otherwise): submit, status, logs, cancel.

Needs the gpufleet image somewhere the cluster can pull (GPUFLEET_TEST_IMAGE), a
PersistentVolumeClaim for checkpoints (GPUFLEET_TEST_PVC, ReadWriteMany for 2 nodes) and a
namespace you may create Jobs and Services in (GPUFLEET_TEST_NAMESPACE, default "default").
Runs the digits workload on CPU, 2 nodes, with the default ``job`` target (no operator).
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from gpufleet.cluster import Cluster
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.support.specs import digits_job

pytestmark = pytest.mark.cluster


def test_digits_job_runs_to_completion_on_the_cluster() -> None:
    image, pvc = os.environ.get("GPUFLEET_TEST_IMAGE"), os.environ.get("GPUFLEET_TEST_PVC")
    if not image or not pvc:
        pytest.skip("set GPUFLEET_TEST_IMAGE and GPUFLEET_TEST_PVC to run on a live cluster")
    name = f"gpufleet-live-{uuid.uuid4().hex[:6]}"
    doc = digits_job(
        name,
        image=image,
        nodes=2,
        procsPerNode=1,
        checkpoint={"dir": f"/ckpt/{name}", "everySteps": 10},
        volumes=[{"name": "ckpt", "mountPath": "/ckpt", "claimName": pvc}],
    )
    cluster = Cluster.connect(os.environ.get("GPUFLEET_TEST_NAMESPACE", "default"))
    cluster.submit(render(validate_training_job(doc), "job"))
    try:
        deadline = time.monotonic() + 900
        status = cluster.status(name)
        while status.phase not in ("Succeeded", "Failed") and time.monotonic() < deadline:
            time.sleep(10)
            status = cluster.status(name)
        assert status.phase == "Succeeded", status.line()
        assert any("done" in line or "accuracy" in line for line in cluster.logs(name))
    finally:
        cluster.cancel(name)
