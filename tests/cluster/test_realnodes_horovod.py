"""A Horovod script trained on the two real nodes through an MPIJob (the MPI Operator's, which
Horovod's users pair it with): the project's image carries Horovod built with Open MPI, the
launcher's mpirun starts one rank per worker pod over SSH, and Horovod's MPI controller runs the
allreduces. Rank 1 killed after epoch 1 fails mpirun; the launcher is restarted, and the script
resumes from its own checkpoint on the shared claim, ending with the weights of an
uninterrupted run under Horovod's own launcher here (tests/support/horovodrun.py), bit for bit."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.devcluster import DevCluster
from tests.support.horovodrun import IMAGE_SCRIPT, WORKERS, horovodrun_reference, script_args
from tests.support.procs import poll_until
from tests.support.realnodes import DIGEST, TENANT, pod_log, processes_in_pod, real_job
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip


def test_a_horovod_mpijob_trains_on_two_nodes_and_resumes_after_a_killed_rank(
    reallab: DevCluster, tmp_path: Path
) -> None:
    name = "horovod-mpijob"
    doc = real_job(name, WORKERS, 1, framework="horovod")
    del doc["spec"]["workload"]
    checkpoints = f"{doc['spec']['checkpoint']['dir']}/horovod"
    doc["spec"]["command"] = [IMAGE_SCRIPT, *script_args(checkpoints, "/tmp/result.json")]
    doc["spec"]["maxRestarts"] = 2
    path = write_spec(reallab.root, doc, f"{name}.yaml")
    submit = reallab.gpufleet("submit", str(path), "--target", "mpijob")
    assert submit.returncode == 0, submit.stderr[-2000:]
    volumes = reallab.dir / "volumes"

    def victim() -> dict[str, object] | None:
        if not list(volumes.glob(f"pv-*/{name}/horovod/checkpoint-1.pth.tar")):
            return None
        return next((p for p in reallab.pods(TENANT, name)
                     if p["metadata"]["name"] == f"{name}-worker-1"), None)  # fmt: skip

    pod = poll_until(victim, what="the script's checkpoint of epoch 1", timeout=300)
    # the rank mpirun started over SSH, under the worker shim
    ranks = processes_in_pod(pod["metadata"]["uid"], b"gpufleet.launch.shim")  # type: ignore[index]
    assert len(ranks) == 1, ranks
    os.kill(ranks[0], signal.SIGKILL)
    phase, pods = reallab.run_to_end(name, TENANT, timeout=400)
    launcher = f"{name}-launcher"
    logs = "".join(pod_log(reallab, n) for n in pods if n.startswith(launcher))
    assert phase == "Succeeded", logs[-3000:]
    placed = {p["spec"]["nodeName"] for n, p in pods.items() if "-worker-" in n}
    assert len(placed) == WORKERS and all(n.startswith("real-") for n in placed), placed
    assert "resumed from epoch" in logs, logs[-3000:]
    reference = horovodrun_reference(tmp_path)
    assert DIGEST.findall(logs) == [reference["digest"]], logs[-3000:]
    assert reallab.cancel(name, TENANT)
