"""Reading and deleting a namespace's objects (cluster/access.py, serving.py and the reads of
Cluster's status, logs and cancel) against the FakeKube stand-in: typed models become the
API's dicts, a 404 is "none" where the kind may not be installed, and every other refusal is
one ClusterError line saying what was being done."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufleet.cluster import Cluster
from gpufleet.cluster.access import ApiAccess, as_dict, items
from gpufleet.errors import ClusterError, UserInputError
from gpufleet.kube import LABEL_JOB, LABEL_ROLE, METRICS_PORT_NAME, ROLE_SERVER, Obj
from tests.support.fake_kube import FakeKube

NS = "team-a"
JOB = {"apiVersion": "batch/v1", "kind": "Job",
       "metadata": {"name": "digits", "namespace": NS, "uid": "u-1",
                    "labels": {LABEL_JOB: "digits"}}}  # fmt: skip
FORBIDDEN = 'User "bob" cannot list resource'


def refusing(status: int, message: str, only: str | None = None, then: Any = None) -> Any:
    """A client method answered with ``status`` (for API group ``only``, else passed on)."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        if only is not None and args[0] != only:
            return then(*args, **kwargs)
        exc = k8s.ApiException(status=status, reason="Refused")
        exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
        raise exc

    return refused


def pod(name: str, phase: str, *, job: str = "digits", ports: list[Obj] | None = None) -> Obj:
    container = {"name": "c", **({"ports": ports} if ports else {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {LABEL_JOB: job}},
            "spec": {"containers": [container]}, "status": {"phase": phase}}  # fmt: skip


def kube_with(*objects: Obj) -> FakeKube:
    kube = FakeKube()
    for obj in (JOB, *objects):
        kube.put(obj)
    return kube


# -- the access helpers -----------------------------------------------------------------------


def test_typed_models_are_read_as_the_apis_camel_case_dicts() -> None:
    created = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    typed = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", creation_timestamp=created),
        status=k8s.V1PodStatus(phase="Running", host_ip="10.0.0.5"),
    )
    listed = k8s.V1PodList(items=[typed])
    assert items(listed) == [typed]
    assert as_dict(typed) == {
        "metadata": {"name": "p", "creationTimestamp": "2026-11-27T12:00:00+00:00"},
        "status": {"phase": "Running", "hostIP": "10.0.0.5"},
    }
    assert items(k8s.V1Status(message="no items here")) == []
    assert items({"items": None}) == []
    obj = {"metadata": {"name": "x"}}
    assert as_dict(obj) is obj


def test_a_refused_pod_list_says_whose_pods() -> None:
    kube = kube_with()
    kube.fail_with = 403
    access = ApiAccess(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), NS)
    with pytest.raises(ClusterError) as info:
        access.pods("digits")
    assert str(info.value).startswith("list pods of digits: forbidden (RBAC): pods is forbidden: ")


def workload(owner_uid: str) -> Obj:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"wl-{owner_uid}", "namespace": NS,
                         "ownerReferences": [{"uid": owner_uid}]},
            "spec": {"queueName": "gpus"}}  # fmt: skip


def test_status_reads_the_workload_its_job_owns_and_no_other() -> None:
    kube = kube_with(workload("someone-else"))
    st = kube.cluster(NS).status("digits")
    assert (st.phase, st.reasons) == ("Pending", [])
    kube.put(workload("u-1"))
    st = kube.cluster(NS).status("digits")
    assert st.phase == "Queued"
    assert st.reasons[0].startswith("Kueue: waiting in LocalQueue gpus: ")


def test_without_kueue_installed_a_job_has_no_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = kube_with(workload("u-1"))
    listing = kube.list_namespaced_custom_object  # Kueue's group answers 404: no such CRD
    monkeypatch.setattr(kube, "list_namespaced_custom_object",
                        _refuse_groups(404, {"kueue.x-k8s.io"}, listing))  # fmt: skip
    st = kube.cluster(NS).status("digits")
    assert (st.phase, st.reasons) == ("Pending", [])
    monkeypatch.setattr(kube, "list_namespaced_custom_object",
                        _refuse_groups(500, {"kueue.x-k8s.io"}, listing))  # fmt: skip
    with pytest.raises(ClusterError, match=r"^list workloads: HTTP 500: refused$"):
        kube.cluster(NS).status("digits")


def _refuse_groups(status: int, groups: set[str], then: Callable[..., Any]) -> Any:
    def listing(group: str, *args: Any, **kwargs: Any) -> Any:
        if group in groups:
            exc = k8s.ApiException(status=status, reason="Refused")
            exc.body = json.dumps({"kind": "Status", "message": "refused", "code": status})
            raise exc
        return then(group, *args, **kwargs)

    return listing


def test_refused_event_reads_say_which_events(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = kube_with()
    monkeypatch.setattr(kube, "list_namespaced_event", refusing(403, FORBIDDEN + ' "events"'))
    with pytest.raises(ClusterError) as no_pods:  # no pod: only the FailedCreate events
        kube.cluster(NS).status("digits")
    assert str(no_pods.value) == (
        f'list FailedCreate events: forbidden (RBAC): {FORBIDDEN} "events"'
    )
    kube.put(pod("digits-0", "Pending"))
    with pytest.raises(ClusterError) as pending:  # a Pending pod: its scheduler events first
        kube.cluster(NS).status("digits")
    assert str(pending.value).startswith("list events of pod digits-0: forbidden (RBAC): ")


def test_a_running_pod_without_a_metrics_port_is_not_asked_for_progress() -> None:
    kube = kube_with(pod("digits-0", "Running"))
    st = kube.cluster(NS).status("digits")
    assert (st.phase, st.progress) == ("Running", None)
    assert kube.called("connect_get_namespaced_pod_proxy_with_path") == []
    kube.put(pod("digits-0", "Running", ports=[{"name": METRICS_PORT_NAME,
                                               "containerPort": 9400}]))  # fmt: skip
    kube.cluster(NS).status("digits")
    assert len(kube.called("connect_get_namespaced_pod_proxy_with_path")) == 1


# -- logs and cancel --------------------------------------------------------------------------


def test_logs_of_one_pod_and_of_a_pod_that_is_not_the_jobs() -> None:
    kube = kube_with(pod("digits-0", "Running"), pod("digits-1", "Running"))
    cluster = kube.cluster(NS)
    assert list(cluster.logs("digits", tail=1, pod="digits-1")) == ["[digits-1] digits-1 line 4"]
    with pytest.raises(UserInputError) as info:
        list(cluster.logs("digits", pod="other-0"))
    (error,) = info.value.errors
    assert (error.path, error.message) == (
        "--pod",
        "other-0 is not a pod of digits: ['digits-0', 'digits-1']",
    )


WAITING = 'container "c" in pod "digits-0" is waiting to start: ContainerCreating'


def test_a_pod_not_started_has_no_log_yet_and_the_others_still_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = kube_with(pod("digits-0", "Pending"), pod("digits-1", "Running"))
    read = kube.read_namespaced_pod_log
    monkeypatch.setattr(kube, "read_namespaced_pod_log",
                        refusing(400, WAITING, only="digits-0", then=read))  # fmt: skip
    lines = list(kube.cluster(NS).logs("digits", tail=1))
    assert lines[0].startswith("[digits-0] (no log yet: ") and "ContainerCreating" in lines[0]
    assert lines[1:] == ["[digits-1] digits-1 line 4"]
    monkeypatch.setattr(kube, "read_namespaced_pod_log",
                        refusing(500, "etcd timed out", only="digits-0", then=read))  # fmt: skip
    with pytest.raises(ClusterError, match=r"^read log of pod digits-0: HTTP 500: etcd timed out$"):
        list(kube.cluster(NS).logs("digits"))


def test_no_log_yet_gives_the_servers_words_not_its_json(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = kube_with(pod("digits-0", "Pending"))
    monkeypatch.setattr(kube, "read_namespaced_pod_log", refusing(400, WAITING))
    assert list(kube.cluster(NS).logs("digits")) == [f"[digits-0] (no log yet: {WAITING})"]


MONITOR = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
           "metadata": {"name": "digits", "namespace": NS,
                        "labels": {LABEL_JOB: "digits"}}}  # fmt: skip


def test_cancel_deletes_the_jobs_pod_monitor() -> None:
    kube = kube_with(MONITOR)
    assert kube.cluster(NS).cancel("digits") == ["Job/digits", "PodMonitor/digits"]
    assert not kube.objects


def test_cancel_without_the_prometheus_operator_or_when_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = kube_with()
    listing = kube.list_namespaced_custom_object
    monkeypatch.setattr(kube, "list_namespaced_custom_object",
                        _refuse_groups(404, {"monitoring.coreos.com"}, listing))  # fmt: skip
    assert kube.cluster(NS).cancel("digits") == ["Job/digits"]  # no PodMonitor CRD: nothing
    kube.put(JOB)
    monkeypatch.setattr(kube, "list_namespaced_custom_object",
                        _refuse_groups(500, {"monitoring.coreos.com"}, listing))  # fmt: skip
    with pytest.raises(ClusterError, match=r"^delete Job digits: HTTP 500: refused$"):
        kube.cluster(NS).cancel("digits")
    kube.put(JOB)
    monkeypatch.setattr(kube, "delete_namespaced_custom_object", refusing(403, FORBIDDEN))
    with pytest.raises(ClusterError, match=r"^delete Job digits: forbidden \(RBAC\): "):
        kube.cluster(NS).cancel("digits")
    assert kube.kinds() == ["Job"]


# -- InferenceServices ------------------------------------------------------------------------


def deployment(replicas: int, ready: int, labels: dict[str, str] | None = None) -> Obj:
    ours = {LABEL_JOB: "digits", LABEL_ROLE: ROLE_SERVER}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "digits", "namespace": NS,
                         "labels": ours if labels is None else labels},
            "spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}  # fmt: skip


def test_a_service_is_found_by_its_deployment_and_folded() -> None:
    kube = FakeKube()
    kube.put(deployment(2, 1))
    kube.put(pod("digits-a", "Running"))
    st = kube.cluster(NS).status("digits")
    assert (st.kind, st.phase, st.reasons) == (
        "InferenceService/Deployment",
        "Degraded",
        ["1/2 replicas ready"],
    )


def test_a_deployment_that_is_not_a_gpufleet_server_is_no_service() -> None:
    kube = FakeKube()
    kube.put(deployment(1, 1, labels={LABEL_JOB: "digits"}))  # no server role
    with pytest.raises(UserInputError, match="no gpufleet job 'digits' in namespace team-a"):
        kube.cluster(NS).status("digits")
    assert kube.cluster(NS).delete_service("digits") == []


def test_a_client_without_typed_apis_finds_no_service() -> None:
    kube = FakeKube()
    kube.put(deployment(1, 1))
    cluster = Cluster(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), NS)
    assert cluster.service("digits") is None
    assert kube.called("read_namespaced_deployment") == []


def test_a_refused_deployment_read_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    monkeypatch.setattr(kube, "read_namespaced_deployment", refusing(403, FORBIDDEN))
    with pytest.raises(ClusterError, match=r"^read Deployment digits: forbidden \(RBAC\): "):
        kube.cluster(NS).status("digits")


def test_deleting_a_service_skips_what_it_does_not_have() -> None:
    kube = FakeKube()
    kube.put(deployment(1, 1))
    for kind, api in (("Service", "v1"), ("HorizontalPodAutoscaler", "autoscaling/v2")):
        kube.put({"apiVersion": api, "kind": kind, "metadata": {"name": "digits", "namespace": NS}})
    assert kube.cluster(NS).cancel("digits") == [
        "HorizontalPodAutoscaler/digits",
        "Service/digits",
        "Deployment/digits",
    ]
    assert not kube.objects
    kserve = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
              "metadata": {"name": "digits", "namespace": NS}}  # fmt: skip
    kube.put(kserve)  # KServe's: no Deployment of ours, found by its own kind
    assert kube.cluster(NS).cancel("digits") == ["InferenceService/digits"]


def test_a_refused_service_deletion_says_what_it_was_deleting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube()
    kube.put(deployment(1, 1))
    monkeypatch.setattr(kube, "delete_namespaced_deployment", refusing(403, FORBIDDEN))
    with pytest.raises(ClusterError, match=r"^delete Deployment digits: forbidden \(RBAC\): "):
        kube.cluster(NS).cancel("digits")
