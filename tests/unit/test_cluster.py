"""``gpufleet status`` from recorded API objects: why a job is pending (Kueue's quota and
preemption, the scheduler, Volcano's gang, an image pull), what runs or failed, pods the
controllers could not create, each pod's node and restarts, a flavor's usage.

No cluster runs here, so the client talks to ``FakeKube`` (tests/support/fake_kube.py) holding the
objects of one recorded scenario (tests/fixtures/cluster/*.yaml, tests/support/scenarios.py),
through the same method names and parameters as kubernetes.client's APIs (checked in
test_fake_kube). Submit, cancel, logs and the client's errors: test_cluster_submit.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.cluster import explain_scheduling, summarize
from gpufleet.errors import EXIT_BAD_INPUT, GpufleetError
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.support.fake_kube import FakeKube
from tests.support.scenarios import connect, kube_of, scenario
from tests.support.specs import cluster_job


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
# control plane, tests/cluster/test_devcluster_queues.py).
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
