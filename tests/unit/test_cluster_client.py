"""The cluster client (cluster/client.py) where the API server says no, or says little: a
kubeconfig's context and the in-cluster account, a refused queue or namespace read, a refused
create rolled back (and a rollback refused in turn), logs of a pod not started, the kept logs
read by a reader pod that this stand-in's kubelet runs here, and a refused cancel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import Configuration
from kubernetes.config import incluster_config, kube_config

from gpufleet.cluster import Cluster
from gpufleet.cluster import client as client_module
from gpufleet.cluster.keptlogs import READER_LABEL
from gpufleet.errors import EXIT_BAD_INPUT, ClusterError, UserInputError
from gpufleet.kube import KUEUE_QUEUE_LABEL, LABEL_RDMA, Obj
from gpufleet.launch.keptlogs import keep, kept_name
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.support.fake_kube import FakeKube
from tests.support.specs import cluster_job

NS = "team-a"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def api_exception(status: int, message: str) -> k8s.ApiException:
    exc = k8s.ApiException(status=status, reason="Refused")
    exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return exc


def refusing(status: int, message: str) -> Callable[..., Any]:
    """A client method that the API server answers with ``status``."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise api_exception(status, message)

    return refused


class Kubelet(FakeKube):
    """FakeKube with namespaces and with pods that run: a created pod's container command runs
    here at once (its image's ``python`` is this one) with the pod's environment and nothing
    of this process's but PATH; its phase and log are what it did. ``pods="pending"``: they stay
    Pending, unschedulable; ``"deadline"``: killed at activeDeadlineSeconds, saying nothing."""

    def __init__(self, pods: str = "run") -> None:
        super().__init__()
        self.mode = pods
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.logs: dict[str, str] = {}
        self.namespaces_read: list[str] = []
        self.created_labels: list[dict[str, str]] = []  # of each pod created

    def read_namespace(self, name: str, **kwargs: Any) -> k8s.V1Namespace:
        self._check()
        self.namespaces_read.append(name)
        if name not in self.namespace_labels:
            raise api_exception(404, f'namespaces "{name}" not found')
        meta = k8s.V1ObjectMeta(name=name, labels=self.namespace_labels[name] or None)
        return k8s.V1Namespace(metadata=meta)

    def create_namespaced_pod(self, namespace: str, body: Obj, **kwargs: Any) -> Obj:
        pod = self._create(self._builtin("pods", namespace, body["metadata"]["name"]), body)
        self.created_labels.append(body["metadata"]["labels"])
        stored = self.objects[self._builtin("pods", namespace, body["metadata"]["name"])]
        if self.mode == "pending":
            unscheduled = {"type": "PodScheduled", "status": "False",
                           "message": "0/3 nodes are available: 3 Insufficient cpu."}  # fmt: skip
            stored["status"] = {"phase": "Pending", "conditions": [unscheduled]}
            return pod
        if self.mode == "deadline":
            stored["status"] = {"phase": "Failed", "reason": "DeadlineExceeded"}
            self.logs[body["metadata"]["name"]] = ""
            return pod
        (container,) = body["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        done = subprocess.run(
            [sys.executable, *container["command"][1:]], env={**env, "PATH": os.environ["PATH"]},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        self.logs[body["metadata"]["name"]] = done.stdout + done.stderr
        stored["status"] = {"phase": "Succeeded" if done.returncode == 0 else "Failed"}
        return pod

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Obj:
        return self._get(self._builtin("pods", namespace, name))

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> str:
        if name in self.logs:
            return self.logs[name]
        return super().read_namespaced_pod_log(name, namespace, **kw)

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Obj:
        self._delete(self._builtin("pods", namespace, name))
        return {"status": "Success"}


def job_objects(target: str = "job", name: str = "digits", **spec: Any) -> list[Obj]:
    doc = cluster_job(target, **spec) | {"metadata": {"name": name, "namespace": NS}}
    return render(validate_training_job(doc), target)


# -- connect ----------------------------------------------------------------------------------


def kubeconfig(path: Path, current: str) -> Path:
    cluster = {"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}
    contexts = [{"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}},
                {"name": "b", "context": {"cluster": "c", "user": "u", "namespace": "team-c"}},
                {"name": "bare", "context": {"cluster": "c", "user": "u"}}]  # fmt: skip
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
                                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                                "contexts": contexts, "current-context": current}))  # fmt: skip
    return path


@pytest.fixture
def kube_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No kubeconfig and not in a pod, and the client's global default restored after. The
    client reads KUBECONFIG when imported: a test sets where it looked instead."""
    monkeypatch.setattr(Configuration, "_default", Configuration._default)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_connect_takes_the_current_contexts_namespace_and_server(
    kube_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    where = "KUBE_CONFIG_DEFAULT_LOCATION"
    kube_env.setattr(kube_config, where, str(kubeconfig(tmp_path / "config", current="a")))
    cluster = Cluster.connect()
    assert cluster.namespace == "team-b"
    assert cluster.custom.api_client.configuration.host == "https://127.0.0.1:6443"
    assert sorted(cluster.apis) == ["AppsV1Api", "AutoscalingV2Api", "CoreV1Api", "PolicyV1Api"]
    assert cluster.apis["PolicyV1Api"].api == "PolicyV1Api"
    assert cluster.apis["CoreV1Api"].api_client is cluster.custom.api_client
    assert Cluster.connect(namespace="other").namespace == "other"
    kube_env.setattr(kube_config, where, str(kubeconfig(tmp_path / "config", current="bare")))
    assert Cluster.connect().namespace == "default"


def test_connect_with_a_context_takes_that_contexts_namespace(
    kube_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = str(kubeconfig(tmp_path / "config", current="a"))
    kube_env.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", config)
    assert Cluster.connect(context="b").namespace == "team-c"  # kubectl --context b: team-c


def test_connect_in_a_pod_uses_its_service_account(
    kube_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kube_env.setattr(client_module, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "namespace"))
    (tmp_path / "token").write_text("pod-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    kube_env.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    kube_env.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    kube_env.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    kube_env.setenv("KUBERNETES_SERVICE_PORT", "443")
    cluster = Cluster.connect()
    assert cluster.namespace == "default"  # no namespace file: the default namespace
    config = cluster.core.api_client.configuration
    assert config.host == "https://10.96.0.1:443"
    assert config.api_key["BearerToken"] == "bearer pod-token"
    (tmp_path / "namespace").write_text("team-b\n")
    assert Cluster.connect().namespace == "team-b"  # the pod's own namespace
    assert Cluster.connect(namespace="team-c").namespace == "team-c"


def test_connect_without_the_client_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes: ImportError
    with pytest.raises(UserInputError) as info:
        Cluster.connect()
    assert info.value.exit_code == EXIT_BAD_INPUT
    (error,) = info.value.errors
    assert error.path == "kubernetes"
    assert "the cluster commands needs: pip install 'gpufleet[cluster]'" in str(info.value)


# -- submit -----------------------------------------------------------------------------------


def test_a_refused_queue_read_is_a_cluster_error_and_nothing_is_created() -> None:
    kube = FakeKube()
    kube.fail_with = 403
    with pytest.raises(ClusterError, match=r"^list LocalQueues in team-a: forbidden \(RBAC\): "):
        kube.cluster(NS).submit(job_objects(queue="gpus"))
    assert not kube.objects


def test_jobs_on_two_queues_that_both_exist_are_created() -> None:
    kube = FakeKube()
    for queue in ("gpus", "cpus"):
        kube.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                  "metadata": {"name": queue, "namespace": NS}})  # fmt: skip
    objects = job_objects("jobset", queue="gpus") + job_objects("jobset", "b", queue="cpus")
    queues = {(o["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL) for o in objects}
    assert {"gpus", "cpus"} <= queues
    assert kube.cluster(NS).submit(objects) == [
        f"{o['kind']}/{o['metadata']['name']}" for o in objects
    ]


def test_a_refused_create_removes_the_custom_objects_created_before_it() -> None:
    kube = FakeKube()
    first = job_objects()  # a Service (built-in), then the Job (through custom objects)
    taken = job_objects("pytorchjob", "taken")
    kube.put(taken[-1], NS)  # already there: the API server answers 409
    with pytest.raises(ClusterError) as info:
        kube.cluster(NS).submit(first + taken[-1:])
    assert str(info.value) == (
        f"create PyTorchJob {NS}/taken: already exists (gpufleet cancel it first): "
        "AlreadyExists; removed again: Job/digits, Service/digits"
    )
    assert kube.kinds() == ["PyTorchJob"]


def test_a_rollback_the_api_server_refuses_is_not_said_to_be_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube()
    taken = job_objects("pytorchjob", "taken")[-1]
    kube.put(taken, NS)
    monkeypatch.setattr(kube, "delete_namespaced_custom_object", refusing(403, "no delete"))
    with pytest.raises(ClusterError) as info:
        kube.cluster(NS).submit([*job_objects(), taken])
    assert str(info.value).endswith(": AlreadyExists; removed again: Service/digits")
    assert sorted(kube.kinds()) == ["Job", "PyTorchJob"]  # left for the user to see


def rdma_job() -> list[Obj]:
    objects = job_objects(nodes=2, procsPerNode=1, resources={"gpu": 1},
                          rdma={"network": "ib-net", "hca": "mlx5_0"})  # fmt: skip
    assert [o["kind"] for o in objects] == ["Service", "Job"]
    return objects


def test_a_restricted_namespace_refuses_rdma_workers_before_anything_is_created() -> None:
    kube = Kubelet()
    kube.namespace_labels[NS] = RESTRICTED
    with pytest.raises(UserInputError) as info:
        kube.cluster(NS).submit(rdma_job())
    (error,) = info.value.errors
    assert error.path == "spec.rdma"
    assert error.message.startswith(
        f"namespace {NS} enforces Pod Security 'restricted', which refuses the IPC_LOCK"
    )
    assert error.message.endswith(f"(label {LABEL_RDMA}); nothing was created")
    assert not kube.objects
    kube.namespace_labels[NS] = {**RESTRICTED, LABEL_RDMA: "true"}  # the chart's rdma tenant
    assert kube.cluster(NS).submit(rdma_job()) == ["Service/digits", "Job/digits"]


def test_a_namespace_without_a_level_is_privileged_and_takes_rdma_workers() -> None:
    kube = Kubelet()
    kube.namespace_labels[NS] = {}
    assert kube.cluster(NS).submit(rdma_job()) == ["Service/digits", "Job/digits"]
    assert kube.namespaces_read == [NS]  # one read, of the one namespace


def test_a_namespace_the_user_may_not_read_is_left_to_admission(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = Kubelet()
    monkeypatch.setattr(kube, "read_namespace", refusing(403, 'User "bob" cannot get namespaces'))
    assert kube.cluster(NS).submit(rdma_job()) == ["Service/digits", "Job/digits"]
    err = " ".join(capsys.readouterr().err.split())
    assert f"note: cannot read namespace {NS}'s Pod Security level (forbidden)" in err
    assert "its RDMA workers are checked when created" in err


def test_another_refused_namespace_read_is_a_cluster_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = Kubelet()
    monkeypatch.setattr(kube, "read_namespace", refusing(500, "etcdserver: request timed out"))
    with pytest.raises(ClusterError) as info:
        kube.cluster(NS).submit(rdma_job())
    assert str(info.value) == f"read namespace {NS}: HTTP 500: etcdserver: request timed out"
    assert not kube.objects


# -- kept logs: the reader pod ----------------------------------------------------------------


def kept_job(tmp_path: Path) -> list[Obj]:
    """A job whose checkpoints (and kept logs) are under ``tmp_path``, its volume's mount."""
    ckpt = {"dir": str(tmp_path / "ckpt"), "everySteps": 50}
    volume = {"name": "ckpt", "mountPath": str(tmp_path), "claimName": "team-ckpt"}
    return job_objects(checkpoint=ckpt, volumes=[volume])


def keep_one_rank(tmp_path: Path) -> str:
    """One launcher's torchelastic logs (rank 0: stdout a, b; stderr warn), kept; its name."""
    rank = tmp_path / "pod" / "run_x" / "attempt_0" / "0"
    rank.mkdir(parents=True)
    (rank / "stdout.log").write_text("a\nb\n")
    (rank / "stderr.log").write_text("warn\n")
    name = kept_name(1000.0, "digits-0")
    assert keep(tmp_path / "pod", str(tmp_path / "ckpt"), name) is not None
    return name


def test_kept_logs_are_printed_by_a_reader_pod_that_is_deleted_after(tmp_path: Path) -> None:
    kube = Kubelet()
    cluster = kube.cluster(NS)
    cluster.submit(kept_job(tmp_path))
    t = keep_one_rank(tmp_path)
    assert list(cluster.kept_logs("digits")) == [
        f"[{t} attempt 0 rank 0] warn",
        f"[{t} attempt 0 rank 0] a",
        f"[{t} attempt 0 rank 0] b",
    ]
    assert list(cluster.kept_logs("digits", tail=1)) == [
        f"[{t} attempt 0 rank 0] warn",
        f"[{t} attempt 0 rank 0] b",
    ]
    readers = [d for d in kube.deleted if d.startswith("Pod/")]  # labelled with the job
    assert kube.created_labels == [{"app.kubernetes.io/managed-by": "gpufleet",
                                    READER_LABEL: "digits"}] * 2  # fmt: skip
    assert len(readers) == 2 and all(d.startswith("Pod/digits-logs-") for d in readers)
    assert kube.pods() == []


def test_a_reader_that_finds_nothing_says_where_it_looked(tmp_path: Path) -> None:
    kube = Kubelet()
    cluster = kube.cluster(NS)
    cluster.submit(kept_job(tmp_path))
    with pytest.raises(ClusterError) as info:
        list(cluster.kept_logs("digits"))
    assert str(info.value) == f"no logs kept in {tmp_path / 'ckpt'}/logs"
    assert kube.pods() == []


def test_a_reader_killed_at_its_deadline_says_why(tmp_path: Path) -> None:
    kube = Kubelet(pods="deadline")
    cluster = kube.cluster(NS)
    cluster.submit(kept_job(tmp_path))
    with pytest.raises(ClusterError, match=r"^the reader pod digits-logs-\w+ failed: "
                       "DeadlineExceeded$"):  # fmt: skip
        list(cluster.kept_logs("digits"))
    assert kube.pods() == []


def test_a_reader_that_never_starts_is_given_up_and_deleted(tmp_path: Path) -> None:
    from gpufleet.cluster.keptlogs import read_kept_logs

    kube = Kubelet(pods="pending")
    objects = kept_job(tmp_path)
    kube.cluster(NS).submit(objects)
    with pytest.raises(ClusterError) as info:
        read_kept_logs(kube.api("CoreV1Api"), NS, objects[-1], timeout=0.01)
    assert str(info.value).endswith(
        "did not finish in 0 s (Pending: 0/3 nodes are available: 3 Insufficient cpu.)"
    )
    assert kube.pods() == []


def test_kept_logs_of_no_job_or_a_refused_reader_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = Kubelet()
    cluster = kube.cluster(NS)
    with pytest.raises(UserInputError) as info:
        list(cluster.kept_logs("digits"))
    assert (info.value.errors[0].path, info.value.errors[0].message) == (
        "NAME",
        f"no gpufleet job 'digits' in namespace {NS}",
    )
    cluster.submit(kept_job(tmp_path))
    refusal = 'pods "digits-logs" is forbidden: violates PodSecurity "restricted:latest"'
    monkeypatch.setattr(kube, "create_namespaced_pod", refusing(403, refusal))
    with pytest.raises(ClusterError) as refused:
        list(cluster.kept_logs("digits"))
    assert str(refused.value) == f"read the kept logs of digits: forbidden: {refusal}"
    assert kube.pods() == []  # nothing was created, nothing left
