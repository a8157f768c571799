"""`gpufleet cluster up`: the real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler built from controlplane/go.mod) with kwok's fake GPU nodes, and a gpufleet job
carried by the real Job controller and scheduler to Succeeded.

`make test` builds the components first (`make controlplane` runs scripts/build-controlplane.sh,
cached in .tools/); run alone without them, these tests skip and say how to build.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.cluster import COMPONENTS, State, binaries_dir, exit_with
from tests.conftest import (
    cli_env,
    cluster_job,
    poll_until,
    processes_mentioning,
    run_cli,
    write_spec,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all((binaries_dir() / name).is_file() for name in COMPONENTS),
        reason=f"control plane not built in {binaries_dir()} (scripts/build-controlplane.sh)",
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A running local cluster (2 nodes x 2 A30), torn down by `gpufleet cluster down`."""
    root = tmp_path_factory.mktemp("devcluster")
    state_dir = root / "state"
    up = run_cli("cluster", "up", "--nodes", "2", "--gpus-per-node", "2", "--dir",
                 str(state_dir), cwd=root, timeout=600)  # fmt: skip
    assert up.returncode == 0, up.stderr[-3000:]
    env = cli_env() | {"KUBECONFIG": str(state_dir / "kubeconfig")}
    try:
        yield {"root": root, "dir": state_dir, "env": env, "up": up}
    finally:
        down = run_cli("cluster", "down", "--dir", str(state_dir), cwd=root)
        assert down.returncode == 0, down.stderr[-2000:]


def kubectl_json(env: dict[str, str], *args: str) -> Any:
    """The API's answer through the admin kubeconfig, via the official Python client."""
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=env["KUBECONFIG"]))
    return api.api_client.sanitize_for_serialization(getattr(api, args[0])(*args[1:]))


def test_up_is_ready_secured_and_found_again(cluster: dict[str, Any]) -> None:
    assert "export KUBECONFIG=" in cluster["up"].stderr
    status = run_cli("cluster", "status", "--dir", str(cluster["dir"]), cwd=cluster["root"])
    assert status.returncode == 0 and status.stdout.count(": running") == len(COMPONENTS)
    again = run_cli("cluster", "up", "--dir", str(cluster["dir"]), cwd=cluster["root"])
    assert again.returncode == 0 and "already running" in again.stderr
    state = State.read(cluster["dir"])
    assert state is not None and state.server.startswith("https://127.0.0.1:")
    port = int(state.server.rsplit(":", 1)[1])
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cluster["dir"] / "pki" / "ca.crt"))
    with pytest.raises(urllib.error.HTTPError) as anonymous:  # no client certificate: refused
        urllib.request.urlopen(f"https://127.0.0.1:{port}/api/v1/namespaces", context=ctx)
    with anonymous.value as refused:
        assert refused.code in (401, 403)


def test_nodes_advertise_gpus(cluster: dict[str, Any]) -> None:
    nodes = kubectl_json(cluster["env"], "list_node")["items"]
    assert len(nodes) == 2
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A30"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def test_a_gpu_job_runs_to_succeeded_and_cancel_leaves_nothing(cluster: dict[str, Any]) -> None:
    env, root = cluster["env"], cluster["root"]
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1},
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "gpujob", "namespace": "default"}
    submit = run_cli("submit", str(write_spec(root, doc, "gpujob.yaml")), cwd=root, env=env)
    assert submit.returncode == 0, submit.stderr[-2000:]

    def succeeded() -> str | None:
        st = run_cli("status", "gpujob", "-n", "default", "-o", "json", cwd=root, env=env)
        phase = json.loads(st.stdout)["phase"] if st.returncode == 0 and st.stdout else ""
        return phase if phase in ("Succeeded", "Failed") else None

    assert poll_until(succeeded, what="the Job to finish", timeout=120, interval=1) == "Succeeded"
    pods = kubectl_json(env, "list_namespaced_pod", "default")["items"]
    pods = [p for p in pods if p["metadata"]["labels"].get("gpufleet.dev/job") == "gpujob"]
    assert len(pods) == 2
    assert {p["spec"]["nodeName"] for p in pods} == {"gpu-node-0", "gpu-node-1"}  # one GPU each
    for pod in pods:
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["status"]["phase"] == "Succeeded"
    cancel = run_cli("cancel", "gpujob", "-n", "default", cwd=root, env=env)
    assert cancel.returncode == 0, cancel.stderr[-2000:]

    def gone() -> bool:
        left = kubectl_json(env, "list_namespaced_pod", "default")["items"]
        return not [p for p in left if p["metadata"]["labels"].get("gpufleet.dev/job") == "gpujob"]

    poll_until(gone, what="the job's pods to be deleted", timeout=60, interval=0.5)


def test_down_stops_every_process_and_frees_the_ports(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    up = run_cli("cluster", "up", "--nodes", "1", "--dir", str(state_dir), cwd=tmp_path,
                 timeout=600)  # fmt: skip
    assert up.returncode == 0, up.stderr[-3000:]
    state = State.read(state_dir)
    assert state is not None
    down = run_cli("cluster", "down", "--dir", str(state_dir), cwd=tmp_path)
    assert down.returncode == 0
    assert not processes_mentioning(str(state_dir))
    for name, port in state.ports.items():
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"{name} still listens on {port}"
    status = run_cli("cluster", "status", "--dir", str(state_dir), cwd=tmp_path)
    assert status.returncode == 1


def clients(env: dict[str, str]) -> tuple[Any, Any]:
    """gpufleet's Cluster client and a BatchV1Api, both on the admin kubeconfig (built from the
    file: the kubernetes package reads KUBECONFIG only once, when first imported)."""
    from kubernetes import client, config

    from gpufleet.cluster import Cluster

    api = config.new_client_from_config(config_file=env["KUBECONFIG"])
    typed = {n: getattr(client, n)(api) for n in ("AppsV1Api", "PolicyV1Api", "AutoscalingV2Api")}
    gpufleet = Cluster(client.CustomObjectsApi(api), client.CoreV1Api(api), "default", typed)
    return gpufleet, client.BatchV1Api(api)


def submit_exiting(cluster: dict[str, Any], name: str, code: int, max_restarts: int) -> None:
    """Submit a 1-node GPU job (target job) whose pods end with exit ``code`` (kwok Stage)."""
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    doc = cluster_job(nodes=1, procsPerNode=1, resources={"gpu": 1}, maxRestarts=max_restarts,
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": "default"}
    objects = render(validate_training_job(doc), "job")
    template = objects[-1]["spec"]["template"]["metadata"]
    template["annotations"] = {**template.get("annotations", {}), **exit_with(code)}
    clients(cluster["env"])[0].submit(objects)


def failed_pods(env: dict[str, str], job: str) -> int:
    pods = kubectl_json(env, "list_namespaced_pod", "default")["items"]
    ours = [p for p in pods if p["metadata"]["labels"].get("gpufleet.dev/job") == job]
    return sum(1 for p in ours if p["status"].get("phase") == "Failed")


def test_failure_policy_on_the_real_job_controller(cluster: dict[str, Any]) -> None:
    """The rendered podFailurePolicy as the Job controller applies it: exit 75 (preempted after a
    checkpoint) is retried without spending maxRestarts; exit 1 spends it and fails the job."""
    env = cluster["env"]
    submit_exiting(cluster, "preempted", 75, max_restarts=1)
    submit_exiting(cluster, "crashing", 1, max_restarts=1)
    batch = clients(env)[1]

    def conditions(name: str) -> set[str]:
        status = batch.read_namespaced_job_status(name, "default").status
        return {c.type for c in (status.conditions or []) if c.status == "True"}

    poll_until(lambda: "Failed" in conditions("crashing"), what="the exit-1 job to fail",
               timeout=240, interval=1)  # fmt: skip
    crashing = batch.read_namespaced_job_status("crashing", "default").status
    assert crashing.failed == 2  # backoffLimit 1: the first failure and one retry
    reasons = {c.reason for c in crashing.conditions if c.type == "Failed"}
    assert reasons == {"BackoffLimitExceeded"}, reasons
    # More exit-75 pods than the budget allows, and the job still runs, none counted.
    poll_until(lambda: failed_pods(env, "preempted") >= 3, what="three exit-75 pods",
               timeout=240, interval=1)  # fmt: skip
    assert "Failed" not in conditions("preempted")
    assert not batch.read_namespaced_job_status("preempted", "default").status.failed
    st = run_cli("status", "crashing", "-n", "default", cwd=cluster["root"], env=env)
    assert "Failed" in st.stdout, st.stdout + st.stderr
    for name in ("preempted", "crashing"):
        assert (
            run_cli("cancel", name, "-n", "default", cwd=cluster["root"], env=env).returncode == 0
        )
