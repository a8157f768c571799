"""Serving on real nodes: the exported digits model on a shared claim, served by `gpufleet
serve` (PyTriton's Triton) from the project's image in the rendered Deployment's pod under
`restricted`, reached from the host through its Service (`kubectl port-forward`) by the
official tritonclient with the model's own answers, and a LoadGen Offline run VALID."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.accounts import port_forward
from tests.support.cli import run_cli
from tests.support.devcluster import DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT
from tests.support.realserving import MODEL, exported, ready_pods, served_by_gpufleet
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip
NAME, CLAIM = "digits-serve", "models"


@pytest.fixture(scope="module")
def served(reallab: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The InferenceService (server gpufleet) Ready on a real node, and the model it serves;
    its gRPC port forwarded to the host."""
    tmp = tmp_path_factory.mktemp("serve")
    model, _ = exported(reallab, tmp, CLAIM)
    doc = served_by_gpufleet(NAME, CLAIM)
    submit = reallab.gpufleet("submit", str(write_spec(tmp, doc, "svc.yaml")))
    assert submit.returncode == 0, submit.stderr[-2000:]
    try:
        poll_until(lambda: ready_pod(reallab), what=f"{NAME} ready", timeout=300, interval=2)
        with port_forward(reallab, TENANT, f"svc/{NAME}", 8001) as address:
            yield model, address
    finally:
        reallab.gpufleet("cancel", NAME, "-n", TENANT)
        poll_until(lambda: not reallab.pods(TENANT, NAME), what=f"{NAME}'s pods gone", timeout=90)
        reallab.core.delete_namespaced_persistent_volume_claim(CLAIM, TENANT)


def ready_pod(cluster: DevCluster) -> dict[str, Any] | None:
    return next(iter(ready_pods(cluster, NAME)), None)


def test_the_pod_on_a_real_node_answers_tritonclient_with_the_models_outputs(
    reallab: DevCluster, served: Any
) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    model, url = served
    pod = ready_pod(reallab)
    assert pod is not None and pod["spec"]["nodeName"].startswith("real-"), pod
    client = grpcclient.InferenceServerClient(url)
    x = np.random.default_rng(0).random((16, 1, 8, 8), dtype=np.float32)
    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer(MODEL, [inp]).as_numpy("OUTPUT__0")
    client.close()
    import torch

    np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(), atol=1e-4)


def test_loadgen_offline_through_the_service_is_valid(served: Any, tmp_path: Path) -> None:
    _, url = served
    out = tmp_path / "loadgen"
    run = run_cli("bench", "inference", "--url", url, "--model", MODEL, "--scenario", "Offline",
                  "--quick", "--outdir", str(out), "-o", "json", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["result"] == "VALID" and result["errors"] == 0, result
