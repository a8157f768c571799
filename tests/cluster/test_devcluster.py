"""`gpufleet cluster up`: the real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, Kueue and JobSet built from controlplane/go.mod) with kwok's fake GPU nodes, and
gpufleet jobs carried by the real Job controller and scheduler to Succeeded.

The cluster is the session's (tests/support/devcluster.py): started once, shared by the live tests;
each test works in a namespace of its own.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.cluster.doctor.requirements import CONTROLLERS as DOCTOR_CONTROLLERS
from gpufleet.cluster.doctor.requirements import TARGET_NEEDS
from gpufleet.devcluster.addons import ADDONS, PROJECTS
from gpufleet.devcluster.build import CONTROL_PLANE
from gpufleet.devcluster.kwok import RUN_FOR_A_DAY, exit_with
from gpufleet.devcluster.platform import VALUES_FILE
from gpufleet.devcluster.state import State
from gpufleet.errors import EXIT_FAILED, EXIT_NO_CHECKPOINT, EXIT_PREEMPTED
from tests.support.cli import run_cli
from tests.support.devcluster import (
    GPUS_PER_NODE,
    NODES,
    PRODUCT,
    DevCluster,
    needs_controlplane,
    start,
)
from tests.support.procs import listeners_among, poll_until, processes_mentioning
from tests.support.specs import cluster_job, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
CONTROLLERS = PROJECTS


def test_up_is_ready_secured_and_found_again(devcluster: DevCluster) -> None:
    assert "export KUBECONFIG=" in devcluster.up.stderr
    written = devcluster.dir / VALUES_FILE  # the chart values for this cluster, and their command
    assert yaml.safe_load(written.read_text()) == {"volcano": {"enabled": True}}
    assert f"-f {written} --wait" in devcluster.up.stderr
    status = run_cli("cluster", "status", "--dir", str(devcluster.dir), cwd=devcluster.root)
    running = [*CONTROL_PLANE, "kwok", *(a.name for a in ADDONS if not a.optional)]
    assert status.returncode == 0 and status.stdout.count(": running") == len(running)
    assert {"kueue: running", "jobset: running"} <= set(status.stdout.splitlines())
    again = run_cli("cluster", "up", "--dir", str(devcluster.dir), cwd=devcluster.root)
    assert again.returncode == 0 and "already running" in again.stderr
    state = State.read(devcluster.dir)
    assert state is not None and state.server.startswith("https://127.0.0.1:")
    ctx = ssl.create_default_context(cafile=str(devcluster.dir / "pki" / "ca.crt"))
    with pytest.raises(urllib.error.HTTPError) as anonymous:  # no client certificate: refused
        urllib.request.urlopen(f"{state.server}/api/v1/namespaces", context=ctx)
    with anonymous.value as refused:
        assert refused.code in (401, 403)


def etcd_value(cluster: DevCluster, key: str) -> bytes:
    """``key``'s value as etcd stores it, read from etcd itself (its v3 JSON gateway, plain
    HTTP on loopback), past the API server."""
    state = State.read(cluster.dir)
    assert state is not None
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    url = f"http://127.0.0.1:{state.ports['etcd']}/v3/kv/range"
    with urllib.request.urlopen(urllib.request.Request(url, body), timeout=10) as resp:
        (kv,) = json.load(resp)["kvs"]
    return base64.b64decode(kv["value"])


def test_a_secret_is_encrypted_in_etcd_with_the_clusters_own_key(devcluster: DevCluster) -> None:
    """Issue 55, item 1: the API server writes a Secret to etcd with secretbox under the key
    `cluster up` made (mode 0600); a reader of etcd sees no plaintext, the API the value."""
    config = devcluster.dir / "pki" / "encryption.yaml"
    assert config.stat().st_mode & 0o777 == 0o600
    (key,) = yaml.safe_load(config.read_text())["resources"][0]["providers"][0]["secretbox"]["keys"]
    plain = "s3cr3t-" + base64.b32encode(os.urandom(10)).decode()
    secret = {"metadata": {"name": "encrypted"}, "stringData": {"token": plain}}
    devcluster.core.create_namespaced_secret("default", secret)
    try:
        stored = etcd_value(devcluster, "/registry/secrets/default/encrypted")
        assert stored.startswith(f"k8s:enc:secretbox:v1:{key['name']}:".encode()), stored[:40]
        assert plain.encode() not in stored and b"token" not in stored
        read = devcluster.core.read_namespaced_secret("encrypted", "default")
        assert base64.b64decode(read.data["token"]).decode() == plain
    finally:
        devcluster.core.delete_namespaced_secret("encrypted", "default")


def test_nodes_advertise_gpus(devcluster: DevCluster) -> None:
    nodes = devcluster.as_dict(devcluster.core.list_node())["items"]
    assert len(nodes) == NODES
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == PRODUCT
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def test_controllers_crds_and_webhooks_come_from_their_modules(devcluster: DevCluster) -> None:
    """Kueue's, JobSet's and the Kubeflow operators' CRDs are served (MPIJob at the MPI
    operator's v2beta1, not the training-operator's v1), and their webhooks answer through the
    API server: Kueue's and the training-operator's validating webhooks refuse objects their CRD
    schemas alone would accept."""
    from kubernetes.client.exceptions import ApiException

    crds = {c.metadata.name for c in devcluster.typed("ApiextensionsV1Api")
            .list_custom_resource_definition().items}  # fmt: skip
    assert {"clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io",
            "jobsets.jobset.x-k8s.io", "servicemonitors.monitoring.coreos.com",
            "queues.scheduling.volcano.sh", "scaledobjects.keda.sh",
            "pytorchjobs.kubeflow.org", "mpijobs.kubeflow.org", "trainjobs.trainer.kubeflow.org",
            "clustertrainingruntimes.trainer.kubeflow.org",
            "jobs.batch.volcano.sh"} <= crds  # fmt: skip
    runtimes = devcluster.custom.list_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")["items"]  # fmt: skip
    assert "torch-distributed" in {r["metadata"]["name"] for r in runtimes}
    mpijobs = devcluster.typed("ApiextensionsV1Api").read_custom_resource_definition(
        "mpijobs.kubeflow.org")  # fmt: skip
    assert [v.name for v in mpijobs.spec.versions] == ["v2beta1"]
    bad = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "webhook-says-no"},
        "spec": {  # two resource groups covering the same resource: only the webhook knows
            "resourceGroups": [
                {"coveredResources": ["cpu"], "flavors": [{"name": "a", "resources": [
                    {"name": "cpu", "nominalQuota": 1}]}]},
                {"coveredResources": ["cpu"], "flavors": [{"name": "b", "resources": [
                    {"name": "cpu", "nominalQuota": 1}]}]},
            ]
        },
    }  # fmt: skip
    with pytest.raises(ApiException) as refused:
        devcluster.custom.create_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", bad, dry_run="All"
        )
    assert refused.value.status in (400, 403, 422), refused.value.body
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "vclusterqueue.kb.io" denied' in message
    assert 'coveredResources[0]: Duplicate value: "cpu"' in message
    nameless = {  # the operator needs a container named "pytorch"; the schema does not say so
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "webhook-says-no", "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {
            "containers": [{"name": "trainer", "image": "x"}]}}}}},
    }  # fmt: skip
    with pytest.raises(ApiException) as refused:
        devcluster.custom.create_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", nameless, dry_run="All"
        )
    message = json.loads(refused.value.body)["message"]
    assert "validator.pytorchjob.training-operator.kubeflow.org" in message, message
    assert "must have at least one container with name pytorch" in message


def test_a_gpu_job_runs_to_succeeded_and_cancel_leaves_nothing(devcluster: DevCluster) -> None:
    ns = devcluster.namespace("plain-job")
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1},
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "gpujob", "namespace": ns}
    submit = devcluster.gpufleet("submit", str(write_spec(devcluster.root, doc, "gpujob.yaml")))
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert devcluster.wait_phase("gpujob", ns, "Succeeded", "Failed") == "Succeeded"
    st = devcluster.gpufleet("status", "gpujob", "-n", ns, "-o", "json")  # what phase() reads
    assert st.returncode == 0 and json.loads(st.stdout)["phase"] == "Succeeded", st.stderr
    pods = devcluster.pods(ns, "gpujob")
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["status"]["phase"] == "Succeeded"
    cancel = devcluster.gpufleet("cancel", "gpujob", "-n", ns)
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    poll_until(lambda: not devcluster.pods(ns, "gpujob"), what="the job's pods to be deleted",
               timeout=60, interval=0.5)  # fmt: skip


def test_a_second_cluster_names_the_fixed_port_it_cannot_have(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    """The MPI operator always listens on 8080 (an upstream constant), which the session's
    cluster holds: a second `cluster up` with it fails before starting anything, in one line
    naming the port and the way out; nothing is left running."""
    up = run_cli("cluster", "up", "--dir", str(tmp_path / "second"), cwd=tmp_path, timeout=120)
    assert up.returncode != 0
    last = up.stderr.strip().splitlines()[-1]
    assert "mpi-operator always listens on port 8080" in last, up.stderr
    assert "--without mpi-operator" in last
    assert "Traceback" not in up.stderr
    assert State.read(tmp_path / "second") is None


def test_a_cluster_without_kueue_then_down_stops_everything(tmp_path: Path) -> None:
    """`--without` every controller: a queued job is refused in one line (Kueue is not
    installed; nothing created); `gpufleet doctor` fails each controller; `down` stops every
    process and frees every port."""
    cluster = start(tmp_path, nodes=1, gpus=1, without=CONTROLLERS)
    state = State.read(cluster.dir)
    try:  # a failed assertion must not leave the cluster running
        assert state is not None and set(state.pids) == {*CONTROL_PLANE, "kwok"}
        doc = cluster_job(nodes=1, procsPerNode=1, queue="team-a",
                          checkpoint={"dir": "s3://b/c"}, volumes=[])  # fmt: skip
        doc["metadata"] = {"name": "queued", "namespace": "default"}
        r = cluster.gpufleet("submit", str(write_spec(tmp_path, doc, "queued.yaml")))
        assert r.returncode == 2 and "Kueue is not installed on this cluster" in r.stderr, r.stderr
        assert not cluster.core.list_namespaced_service(
            "default", label_selector="gpufleet.dev/job"
        ).items
        # doctor says what is missing, one FAIL line (at least) for each controller left out
        targets = [a for t in TARGET_NEEDS for a in ("--target", t)]
        done = cluster.gpufleet("doctor", "-o", "json", *targets)
        assert done.returncode == EXIT_FAILED, done.stderr[-2000:]
        checks = json.loads(done.stdout)["checks"]
        for c in DOCTOR_CONTROLLERS:
            assert any(x["check"].split()[0] == c.name and x["status"] == "FAIL" for x in checks)
        kueue = next(x for x in checks if x["check"] == "kueue CRDs")
        assert "missing clusterqueues.kueue.x-k8s.io" in kueue["detail"] and kueue["fix"]
    finally:
        down = run_cli("cluster", "down", "--dir", str(cluster.dir), cwd=tmp_path)
    assert down.returncode == 0
    assert not processes_mentioning(str(cluster.dir))
    assert not listeners_among(state.ports, str(cluster.dir), state.pids.values())
    status = run_cli("cluster", "status", "--dir", str(cluster.dir), cwd=tmp_path)
    assert status.returncode == 1


def submit_exiting(
    cluster: DevCluster, ns: str, name: str, code: int, restarts: int, target: str = "job"
) -> None:
    """Submit a 1-node GPU job whose pods end with exit ``code`` (kwok Stage)."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    doc = cluster_job(nodes=1, procsPerNode=1, resources={"gpu": 1}, maxRestarts=restarts,
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": ns}
    objects = render(validate_training_job(doc), target)
    spec = objects[-1]["spec"]
    if target == "jobset":
        spec = spec["replicatedJobs"][0]["template"]["spec"]
    template = spec["template"]["metadata"]
    template["annotations"] = {**template.get("annotations", {}), **exit_with(code)}
    Cluster(cluster.custom, cluster.core, ns).submit(objects)


def failed_pods(cluster: DevCluster, ns: str, job: str) -> int:
    return sum(1 for p in cluster.pods(ns, job) if p["status"].get("phase") == "Failed")


def test_failure_policy_on_the_real_job_controller(devcluster: DevCluster) -> None:
    """The rendered podFailurePolicy as the Job controller applies it: exit 75 (preempted after a
    checkpoint) is retried without spending maxRestarts; exit 1 spends it and fails the job."""
    ns = devcluster.namespace("failure-policy")
    submit_exiting(devcluster, ns, "preempted", 75, restarts=1)
    submit_exiting(devcluster, ns, "crashing", 1, restarts=1)
    batch = devcluster.typed("BatchV1Api")

    def conditions(name: str) -> set[str]:
        status = batch.read_namespaced_job_status(name, ns).status
        return {c.type for c in (status.conditions or []) if c.status == "True"}

    poll_until(lambda: "Failed" in conditions("crashing"), what="the exit-1 job to fail",
               timeout=240, interval=1)  # fmt: skip
    crashing: Any = batch.read_namespaced_job_status("crashing", ns).status
    assert crashing.failed == 2  # backoffLimit 1: the first failure and one retry
    reasons = {c.reason for c in crashing.conditions if c.type == "Failed"}
    assert reasons == {"BackoffLimitExceeded"}, reasons
    # More exit-75 pods than the budget allows, and the job still runs, none counted.
    poll_until(lambda: failed_pods(devcluster, ns, "preempted") >= 3,
               what="three exit-75 pods", timeout=240, interval=1)  # fmt: skip
    assert "Failed" not in conditions("preempted")
    assert not batch.read_namespaced_job_status("preempted", ns).status.failed
    st = devcluster.gpufleet("status", "crashing", "-n", ns)
    assert "Failed" in st.stdout, st.stdout + st.stderr
    for name in ("preempted", "crashing"):
        assert devcluster.cancel(name, ns)


def test_a_fatal_exit_code_fails_the_job_and_jobset_at_once(devcluster: DevCluster) -> None:
    """Exit 4 (no usable checkpoint; likewise 2, 5, 6) cannot be fixed by a restart: the Job
    fails on the first such pod although maxRestarts allows 3 (it used all of them), and the
    JobSet fails without restarting (its preemption rule would have restarted it for ever)."""
    ns = devcluster.namespace("fatal")
    submit_exiting(devcluster, ns, "fatal-job", EXIT_NO_CHECKPOINT, restarts=3)
    submit_exiting(devcluster, ns, "fatal-set", EXIT_NO_CHECKPOINT, restarts=3, target="jobset")
    assert devcluster.wait_phase("fatal-job", ns, "Failed", "Succeeded", timeout=180) == "Failed"
    job = devcluster.typed("BatchV1Api").read_namespaced_job_status("fatal-job", ns).status
    assert job.failed == 1, job
    assert {c.reason for c in job.conditions if c.type == "Failed"} == {"PodFailurePolicy"}
    assert devcluster.wait_phase("fatal-set", ns, "Failed", "Succeeded", timeout=180) == "Failed"
    jobset = devcluster.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "fatal-set"
    )
    assert not jobset["status"].get("restarts"), jobset["status"]
    for name in ("fatal-job", "fatal-set"):
        assert devcluster.cancel(name, ns)


def test_a_lost_rendezvous_host_costs_no_restart(devcluster: DevCluster) -> None:
    """Pod 0 of a 2-pod job (the c10d store's host) is evicted, as a drain or a lost node does;
    pod 1's launcher then exits 75, as it does when its rendezvous host is gone
    (test_pod_launcher runs that launcher). The real Job controller counts neither: both indexes
    get a new pod and status.failed stays 0 (it was 1 per lost pod 0 when the launcher exited 1
    there), so a lost pod 0 never spends spec.maxRestarts. The evicted pod ends Failed (exit 143)
    as a kubelet ends it (gpufleet's pod-terminate Stage), carrying the DisruptionTarget
    condition the Eviction API adds."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    ns = devcluster.namespace("lost-host")
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1}, maxRestarts=1,
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "lost", "namespace": ns}
    objects = render(validate_training_job(doc), "job")
    template = objects[-1]["spec"]["template"]["metadata"]
    template["annotations"] = {**template.get("annotations", {}), **RUN_FOR_A_DAY}
    Cluster(devcluster.custom, devcluster.core, ns).submit(objects)
    index = "batch.kubernetes.io/job-completion-index"

    def running() -> dict[str, str] | None:
        pods = devcluster.pods(ns, "lost")
        live = [p for p in pods if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        up = {p["metadata"]["labels"][index]: p["metadata"]["name"] for p in live}
        return up if set(up) == {"0", "1"} else None

    first = poll_until(running, what="both pods Running", timeout=120, interval=1)
    from kubernetes import client

    devcluster.core.create_namespaced_pod_eviction(
        first["0"], ns,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=first["0"], namespace=ns)),
    )  # fmt: skip
    devcluster.core.patch_namespaced_pod(
        first["1"], ns,
        {"metadata": {"annotations": exit_with(EXIT_PREEMPTED)}},
    )  # fmt: skip

    def replaced() -> dict[str, str] | None:
        now = running()
        return now if now and not set(now.values()) & set(first.values()) else None

    poll_until(replaced, what="a new pod for both indexes", timeout=180, interval=1)
    status = devcluster.typed("BatchV1Api").read_namespaced_job_status("lost", ns).status
    assert not status.failed, status
    assert not any(c.type == "Failed" and c.status == "True" for c in status.conditions or [])
    assert devcluster.cancel("lost", ns)
