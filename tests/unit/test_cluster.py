"""``gpufleet status`` from recorded API objects, and the client's calls against a stand-in API.

No cluster runs here, so the client talks to ``FakeKube`` (tests/support/fake_kube.py) holding the
objects of one recorded scenario (tests/fixtures/cluster/*.yaml), through the same method names
and parameters as kubernetes.client's APIs (checked in test_fake_kube).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cluster import Cluster, ClusterError, explain_scheduling, summarize
from gpufleet.errors import EXIT_BAD_INPUT, GpufleetError, UserInputError
from gpufleet.kube import LABEL_JOB
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.support.fake_kube import FakeKube
from tests.support.paths import REPO
from tests.support.specs import cluster_job

FIXTURES = REPO / "tests" / "fixtures" / "cluster"


def scenario(name: str) -> dict[str, Any]:
    return yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())  # type: ignore[no-any-return]


def summary(name: str) -> Any:
    s = scenario(name)
    return summarize(s["job"], s["pods"], s["events"], workload=s.get("workload"),
                     local_queue=s.get("localQueue"), cluster_queue=s.get("clusterQueue"),
                     podgroup=s.get("podgroup"))  # fmt: skip


# -- why is my job pending? -----------------------------------------------------------------


def test_kueue_quota_names_the_cluster_queue_and_what_is_used_up() -> None:
    st = summary("kueue-quota")
    assert st.phase == "Queued"
    line = st.line()
    assert "LocalQueue team-a -> ClusterQueue team-a" in line
    assert "insufficient unused quota for nvidia.com/gpu in flavor a30, 4 more needed" in line
    assert "ClusterQueue team-a is full: nvidia.com/gpu in flavor a30: 4 of 4 used" in line
    assert "cpu in flavor" not in line  # only exhausted resources are named


# Kueue v0.19.2's conditions on a workload preempted by its lender (recorded on the local
# control plane, tests/cluster/test_devcluster_platform.py).
PREEMPTED_BY_LENDER = (
    "Preempted to accommodate a workload (UID: 11c56a05-d67f-4747-9162-e0594e1b6a27, JobUID: "
    "87967475-8792-4ea6-8091-863b5e14ddc9) due to reclamation within the cohort; preemptor path: "
    "/lab/product; preemptee path: /lab/research"
)


def test_a_preempted_workload_says_once_by_which_queue_and_that_it_is_requeued() -> None:
    from gpufleet.cluster.status import kueue_reasons

    workload = {
        "spec": {"queueName": "research"},
        "status": {"conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending",
             "message": "couldn't assign flavors to pod set worker: insufficient unused quota "
                        "for nvidia.com/gpu in flavor a30, 2 more needed"},
            {"type": "Evicted", "status": "True", "reason": "Preempted",
             "message": PREEMPTED_BY_LENDER},
            {"type": "Preempted", "status": "True", "reason": "InCohortReclamation",
             "message": PREEMPTED_BY_LENDER},
        ]},
    }  # fmt: skip
    admitted, reasons = kueue_reasons(workload, {"spec": {"clusterQueue": "research"}}, None)
    assert admitted is False
    preempted = [r for r in reasons if "preempt" in r.lower()]
    assert preempted == [
        "Kueue: preempted (InCohortReclamation) by a workload of ClusterQueue product; requeued"
    ]
    evicted_otherwise = {"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout",
                         "message": "Exceeded the PodsReady timeout"}  # fmt: skip
    workload["status"]["conditions"] = [evicted_otherwise]
    assert kueue_reasons(workload, None, None)[1][-1] == (
        "Kueue: evicted (PodsReadyTimeout): Exceeded the PodsReady timeout"
    )
    workload["status"]["requeueState"] = {"count": 2, "requeueAt": "2026-11-27T14:30:00Z"}
    assert kueue_reasons(workload, None, None)[1][-1] == (
        "Kueue: evicted (PodsReadyTimeout): Exceeded the PodsReady timeout; its quota freed, "
        "queued again at 2026-11-27T14:30:00Z (eviction 2)"
    )


def test_unschedulable_pods_explained_in_plain_words() -> None:
    st = summary("unschedulable")
    assert st.phase == "Pending" and st.pods == {"Pending": 2}
    assert "2 node(s) without enough free nvidia.com/gpu" in st.line()
    assert "3 node(s) with a taint the pod does not tolerate" in st.line()
    assert "node-role.kubernetes.io/control-plane" in st.line()
    assert st.line().startswith("digits (Job): Pending, pods 0/2 Running;")


def test_missing_local_queue() -> None:
    st = summary("no-localqueue")
    assert st.phase == "Queued"
    assert "LocalQueue team-x doesn't exist" in st.line()


def test_volcano_gang_reason() -> None:
    st = summary("volcano-gang")
    assert st.phase == "Pending"
    assert "Volcano gang" in st.line() and "2/2 tasks in gang unschedulable" in st.line()


def test_image_pull_problem() -> None:
    st = summary("image-pull")
    assert st.phase == "Pending"
    assert "ImagePullBackOff" in st.line()


def test_running_and_failed() -> None:
    running = summary("running")
    assert running.phase == "Running" and running.reasons == []
    assert running.line() == "digits (PyTorchJob): Running, pods 2/2 Running"
    failed = summary("failed")
    assert failed.phase == "Failed"
    assert "backoff limit" in failed.line() and "last exited 1" in failed.line()


def test_suspended_with_a_queue_label_but_no_workload() -> None:
    s = scenario("kueue-quota")
    st = summarize(s["job"], [], [])
    assert st.phase == "Queued" and "no Workload" in st.line()


@pytest.mark.parametrize(
    ("message", "want"),
    [
        ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", "3 node(s) without enough"),
        ("0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.",
         "nodeSelector/affinity"),
        ("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
         "PersistentVolumeClaim is not bound"),
        ("something new", "something new"),
    ],
)  # fmt: skip
def test_explain_scheduling(message: str, want: str) -> None:
    assert want in explain_scheduling(message)


# -- the client, against recorded objects ----------------------------------------------------


def kube_of(name: str) -> FakeKube:
    """A FakeKube holding one recorded scenario (tests/fixtures/cluster/<name>.yaml)."""
    s = scenario(name)
    kube = FakeKube()
    for key in ("job", "workload", "localQueue", "clusterQueue", "podgroup"):
        if s.get(key) is not None:
            kube.put(s[key])
    for pod in s["pods"]:
        # Recorded pods are trimmed to what status reads; in the API server they are Pods
        # carrying the job label the renderers set (status lists them by it).
        labels = {**(pod["metadata"].get("labels") or {}), LABEL_JOB: "digits"}
        kube.put({"apiVersion": "v1", "kind": "Pod", **pod,
                  "metadata": {**pod["metadata"], "labels": labels}})  # fmt: skip
    kube.events = s["events"]
    return kube


def connect(kube: FakeKube) -> Cluster:
    return kube.cluster("team-a")


def test_status_follows_workload_to_cluster_queue() -> None:
    st = connect(kube_of("kueue-quota")).status("digits")
    assert st.phase == "Queued" and "ClusterQueue team-a is full" in st.line()


def test_status_reads_scheduler_events_of_pending_pods() -> None:
    kube = kube_of("unschedulable")
    kube.pods()[1]["status"]["conditions"] = []  # only the event explains pod 0; pod 1 is mute
    st = connect(kube).status("digits")
    assert "pod digits-0-7xk2p unschedulable" in st.line()


def test_status_volcano_podgroup() -> None:
    st = connect(kube_of("volcano-gang")).status("digits")
    assert "Volcano gang" in st.line()


def test_unknown_job_is_bad_input() -> None:
    with pytest.raises(GpufleetError) as info:
        connect(FakeKube()).status("digits")
    assert info.value.exit_code == EXIT_BAD_INPUT


def test_submit_then_cancel_removes_everything() -> None:
    kube = FakeKube()
    cluster = connect(kube)
    job = validate_training_job(cluster_job() | {"metadata": {"name": "digits"}})
    assert cluster.submit(render(job, "job")) == ["Service/digits", "Job/digits"]
    assert ("batch", "v1", "team-a", "jobs", "digits") in kube.objects
    with pytest.raises(GpufleetError, match="already exists"):
        cluster.submit(render(job, "job")[1:])
    assert cluster.cancel("digits") == ["Job/digits", "Service/digits"]
    assert not kube.objects


@pytest.mark.parametrize(("status", "words"), [(403, "forbidden (RBAC)"), (500, "HTTP 500")])
def test_api_errors_become_one_line_cluster_errors(status: int, words: str) -> None:
    kube = kube_of("running")
    kube.fail_with = status
    with pytest.raises(ClusterError, match=re.escape(words)):
        connect(kube).status("digits")


def test_a_bug_of_ours_is_not_relabelled_as_a_cluster_error() -> None:
    """Only the client's ApiException (and transport errors) become ClusterError; a
    programming error propagates as itself, with its traceback."""

    class Broken(FakeKube):
        def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
            raise TypeError("a bug")

    kube = Broken()
    for obj in kube_of("running").objects.values():
        kube.put(obj)
    with pytest.raises(TypeError, match="a bug"):
        connect(kube).status("digits")


def test_logs_prefix_each_pod() -> None:
    lines = list(connect(kube_of("running")).logs("digits", tail=2))
    assert lines == [
        "[digits-master-0] digits-master-0 line 3",
        "[digits-master-0] digits-master-0 line 4",
        "[digits-worker-0] digits-worker-0 line 3",
        "[digits-worker-0] digits-worker-0 line 4",
    ]


def test_cli_without_a_cluster_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["status", "digits"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "KUBECONFIG" in result.output and "Traceback" not in result.output


def test_submit_refuses_a_namespace_flag_that_contradicts_the_spec(tmp_path: Path) -> None:
    """The spec's namespace is never silently overridden (it was: `-n product` went to team-a,
    then printed `gpufleet status digits -n product`); exit 2 before any API call."""
    example = REPO / "examples" / "digits-serving.yaml"  # metadata.namespace: team-a
    result = CliRunner().invoke(app, ["submit", str(example), "-n", "product"],
                                env={"KUBECONFIG": str(tmp_path / "none")})  # fmt: skip
    assert result.exit_code == EXIT_BAD_INPUT
    assert "metadata.namespace" in result.output and "'team-a'" in result.output
    assert "Traceback" not in result.output


QUOTA_REFUSAL = (
    'jobs.batch "digits" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
    "used: count/jobs.batch=0, limited: count/jobs.batch=0"
)


def test_a_refused_object_leaves_nothing_half_applied() -> None:
    """The API server refuses the Job after the Service was created: the Service is deleted
    again and the one-line error says what the server said and what was removed."""

    class RefusesJobs(FakeKube):
        def create_namespaced_custom_object(self, group: str, *args: Any, **kw: Any) -> Any:
            if group == "batch":
                raise k8s_api_exception(403, QUOTA_REFUSAL)
            return super().create_namespaced_custom_object(group, *args, **kw)

    kube = RefusesJobs()
    job = validate_training_job(cluster_job() | {"metadata": {"name": "digits"}})
    objects = render(job, "job")
    assert [o["kind"] for o in objects] == ["Service", "Job"]
    with pytest.raises(ClusterError) as refused:
        connect(kube).submit(objects)
    message = str(refused.value)
    assert "exceeded quota: jobs" in message and "removed again: Service/digits" in message
    assert "\n" not in message and '{"kind"' not in message  # the server's words, one line
    assert not kube.objects


def k8s_api_exception(status: int, message: str) -> Exception:
    import json

    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=status, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return exc


def test_a_queued_job_needs_its_local_queue_and_kueue() -> None:
    job = validate_training_job(
        cluster_job(queue="team-a") | {"metadata": {"name": "digits", "namespace": "team-a"}}
    )
    kube = FakeKube()
    with pytest.raises(UserInputError) as missing:
        connect(kube).submit(render(job, "jobset"))
    assert missing.value.errors[0].path == "spec.queue"
    assert "no LocalQueue 'team-a' in namespace team-a (it has none)" in str(missing.value)
    assert not kube.objects

    class NoKueue(FakeKube):
        def list_namespaced_custom_object(self, group: str, *args: Any, **kw: Any) -> Any:
            if group == "kueue.x-k8s.io":
                raise k8s_api_exception(404, "the server could not find the requested resource")
            return super().list_namespaced_custom_object(group, *args, **kw)

    with pytest.raises(UserInputError, match="Kueue is not installed on this cluster"):
        connect(NoKueue()).submit(render(job, "jobset"))


def test_pods_the_api_server_refused_are_reported() -> None:
    """Three of five pods run and the Job controller's FailedCreate says why the rest do not
    exist (recorded on the local control plane: Kueue admitted more than the ResourceQuota)."""
    kube = FakeKube()
    job = validate_training_job(cluster_job(nodes=5) | {"metadata": {"name": "wide"}})
    connect(kube).submit(render(job, "job"))
    kube.events.append({
        "reason": "FailedCreate", "type": "Warning",
        "involvedObject": {"kind": "Job", "name": "wide", "namespace": "team-a"},
        "lastTimestamp": "2026-11-23T12:00:00Z",
        "message": 'Error creating: pods "wide-3-szs4m" is forbidden: exceeded quota: '
                   "gpufleet-quota, requested: requests.nvidia.com/gpu=2, used: "
                   "requests.nvidia.com/gpu=6, limited: requests.nvidia.com/gpu=6",
    })  # fmt: skip
    line = connect(kube).status("wide").line()
    assert "the Job controller cannot create pods: Error creating: pods" in line
    assert "exceeded quota: gpufleet-quota" in line


def test_pods_the_training_operator_could_not_create_are_reported() -> None:
    """The training-operator names its event FailedCreatePod, not FailedCreate (message as the
    real operator wrote it on the local control plane for a Worker with its init-pytorch)."""
    kube = FakeKube()
    job = validate_training_job(cluster_job(nodes=2) | {"metadata": {"name": "pt"}})
    connect(kube).submit(render(job, "pytorchjob"))
    kube.events.append({
        "reason": "FailedCreatePod", "type": "Warning",
        "involvedObject": {"kind": "PyTorchJob", "name": "pt", "namespace": "team-a"},
        "lastTimestamp": "2026-11-23T15:00:00Z",
        "message": 'Error creating: pods "pt-worker-0" is forbidden: violates PodSecurity '
                   '"restricted:latest": allowPrivilegeEscalation != false (container '
                   '"init-pytorch" must set securityContext.allowPrivilegeEscalation=false)',
    })  # fmt: skip
    line = connect(kube).status("pt").line()
    assert "the PyTorchJob controller cannot create pods: Error creating" in line
    assert "init-pytorch" in line


def test_a_queued_pytorchjob_without_workload_names_kueues_missing_integration() -> None:
    """Kueue's default configuration does not manage PyTorchJobs: the job stays suspended
    with no Workload; status says which integration to enable instead of guessing."""
    job = validate_training_job(cluster_job(queue="team-a") | {"metadata": {"name": "pt"}})
    (pytorchjob,) = [o for o in render(job, "pytorchjob") if o["kind"] == "PyTorchJob"]
    pytorchjob["status"] = {"conditions": [
        {"type": "Suspended", "status": "True", "reason": "JobSuspended"}]}  # fmt: skip
    st = summarize(pytorchjob, [])
    assert st.phase == "Queued"
    assert "its kubeflow.org/pytorchjob integration is off in Kueue's default configuration" in (
        st.line()
    )


def test_status_names_each_pods_node_restarts_and_last_exit_code() -> None:
    """`status --pods` and `-o json` podStates: a pod whose container crashed once and runs
    again, and one that ended; the kubelet's fields, not the job's."""
    crashed = {
        "metadata": {"name": "train-0"},
        "spec": {"nodeName": "real-node-0"},
        "status": {"phase": "Running", "containerStatuses": [{
            "restartCount": 1, "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}]},
    }  # fmt: skip
    ended = {
        "metadata": {"name": "train-1"},
        "spec": {"nodeName": "real-node-1"},
        "status": {"phase": "Succeeded", "containerStatuses": [{
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
    }  # fmt: skip
    job = {"kind": "Job", "metadata": {"name": "train"}, "status": {"active": 1}}
    st = summarize(job, [ended, crashed], [])
    assert [p.line() for p in st.pod_states] == [
        "pod train-0 on real-node-0: Running, restarts 1, last exit 137 (Error)",
        "pod train-1 on real-node-1: Succeeded, restarts 0, last exit 0 (Completed)",
    ]
    assert st.as_dict()["podStates"][0]["lastExitCode"] == 137


def test_a_flavor_without_a_resource_is_not_full_of_it() -> None:
    """A CPU flavor's nominal GPU quota is 0, and 0 are used: not "full" (a GPU job waiting
    for its topology would otherwise read as waiting for quota)."""
    from gpufleet.cluster.status import _cq_usage

    def flavor(name: str, gpus: str) -> dict[str, Any]:
        return {"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}

    def used(name: str, gpus: str) -> dict[str, Any]:
        return {"name": name, "resources": [{"name": "nvidia.com/gpu", "total": gpus}]}

    cq = {
        "spec": {"resourceGroups": [{"flavors": [flavor("cpu", "0"), flavor("h100", "8")]}]},
        "status": {"flavorsUsage": [used("cpu", "0"), used("h100", "8")]},
    }
    assert _cq_usage(cq) == ["nvidia.com/gpu in flavor h100: 8 of 8 used (0 borrowed)"]
