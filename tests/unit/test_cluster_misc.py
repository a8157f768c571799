"""The cluster package's pure parts at their less travelled branches: the client's error
translation, the kinds table, a RayJob's phase, the status folding (Kueue's admission checks,
an inactive ClusterQueue, a finished job, an InferenceService's Deployment), a replaced pod's
note, the reader pod of a job that keeps no logs, and doctor's checks on what it could not
read or did not find."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, generate_latest
from urllib3.exceptions import HTTPError, MaxRetryError

from gpufleet.cluster.apierrors import api_errors, server_message, to_cluster_error
from gpufleet.cluster.doctor import Status
from gpufleet.cluster.doctor.requirements import DEVICE_PLUGIN, NAD_CRD, PROMETHEUS_OPERATOR_CRDS
from gpufleet.cluster.keptlogs import reader_pod, worker_pod_spec
from gpufleet.cluster.kinds import JOB_KINDS, kind_of
from gpufleet.cluster.phases import job_phase
from gpufleet.cluster.progress import progress_line
from gpufleet.cluster.replaced import replaced_note
from gpufleet.cluster.status import (
    PodState,
    kueue_reasons,
    podgroup_reasons,
    summarize,
    summarize_service,
)
from gpufleet.errors import ClusterError, UserInputError
from gpufleet.kube import KUEUE_QUEUE_LABEL, LABEL_RDMA, Obj
from gpufleet.render import render
from gpufleet.runtime.context import ENV_CHECKPOINT_DIR
from gpufleet.runtime.metrics import JobMetrics
from gpufleet.spec import validate_training_job
from tests.support.fake_kube import FakeKube
from tests.support.specs import cluster_job
from tests.unit.test_doctor import healthy, lines

# -- apierrors --------------------------------------------------------------------------------


def test_without_the_client_no_exception_is_a_cluster_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api_errors.cache_clear()
    try:
        with monkeypatch.context() as without:
            without.setitem(sys.modules, "kubernetes.client.exceptions", None)
            assert api_errors() == ()
    finally:
        api_errors.cache_clear()  # the next call imports the client again
    assert api_errors() == (ApiException, HTTPError)


def exception(status: int, body: str, reason: str = "Bad Request") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = body
    return exc


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ('{"kind": "Status", "message": "quota\\n  exceeded"}', "quota exceeded"),
        ("upstream connect error\n  or disconnect", "upstream connect error or disconnect"),
        ('["a", "list"]', '["a", "list"]'),  # JSON, but no Status: the body as given
        ("", "Bad Request"),  # no body: the reason
    ],
)
def test_the_servers_words_are_one_line(body: str, want: str) -> None:
    assert server_message(exception(422, body)) == want
    assert str(to_cluster_error(exception(422, body), "create Job a")) == (
        f"create Job a: rejected as invalid: {want}"
    )


@pytest.mark.parametrize(
    ("reason", "want"),
    [
        ("AlreadyExists", "already exists (gpufleet cancel it first)"),
        ("Conflict", "changed since it was read (a newer version is stored; read it again)"),
    ],
)
def test_a_409_says_whether_the_object_exists_or_changed_since_it_was_read(
    reason: str, want: str
) -> None:
    """Both are HTTP 409; the Status's reason tells a create of a taken name from an update
    with an older resourceVersion."""
    body = json.dumps({"kind": "Status", "reason": reason, "message": "m"})
    assert str(to_cluster_error(exception(409, body, "Conflict"), "patch Job a")) == (
        f"patch Job a: {want}: m"
    )


def test_a_long_answer_is_cut_and_an_unreached_server_is_said() -> None:
    assert len(server_message(exception(500, "x" * 2000))) == 500
    unreached = MaxRetryError(None, "/api/v1/pods", reason="Connection refused")  # type: ignore[arg-type]
    error = to_cluster_error(unreached, "list pods of a")
    assert isinstance(error, ClusterError)
    assert str(error).startswith("list pods of a: cannot reach the API server: ")
    assert "Connection refused" in str(error)
    assert str(to_cluster_error(exception(418, ""), "x")) == "x: HTTP 418: Bad Request"


# -- kinds, phases ----------------------------------------------------------------------------


def test_a_kind_gpufleet_never_renders_is_a_value_error() -> None:
    assert kind_of({"apiVersion": "kubeflow.org/v1", "kind": "TFJob"}).plural == "tfjobs"
    with pytest.raises(ValueError, match=r"^not a gpufleet kind: v1 ConfigMap$"):
        kind_of({"apiVersion": "v1", "kind": "ConfigMap"})
    assert JOB_KINDS[0].api_version == "batch/v1"  # the core of "group/version" is kept


@pytest.mark.parametrize(
    ("status", "want"),
    [
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, ("Succeeded", "")),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "FAILED", "message": "exit 1"},
         ("Failed", "exit 1")),
        ({"jobDeploymentStatus": "Retrying", "reason": "AppFailed"}, ("Restarting", "AppFailed")),
        ({"jobDeploymentStatus": "Initializing"}, ("Pending", "")),
        ({}, (None, "")),
    ],
)  # fmt: skip
def test_a_rayjobs_phase_is_its_deployment_status_and_its_jobs(
    status: Obj, want: tuple[str | None, str]
) -> None:
    assert job_phase({"apiVersion": "ray.io/v1", "kind": "RayJob", "status": status}) == want


# -- status -----------------------------------------------------------------------------------


def job(conditions: list[Obj] | None = None, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "digits", "labels": labels or {}},
            "status": {"conditions": conditions or []}}  # fmt: skip


def pod(name: str, phase: str, **status: Any) -> Obj:
    return {"metadata": {"name": name}, "spec": {"nodeName": "n1"},
            "status": {"phase": phase, **status}}  # fmt: skip


WAITING_CHECKS = {"type": "Admitted", "status": "False", "message": "ProvisioningRequest"}


def test_kueue_admission_with_quota_reserved_waits_for_its_checks() -> None:
    reserved = {"type": "QuotaReserved", "status": "True"}
    workload = {"status": {"conditions": [reserved, WAITING_CHECKS]}}
    assert kueue_reasons(workload, None, None) == (
        False, ["Kueue: quota reserved, waiting for admission checks: ProvisioningRequest"]
    )  # fmt: skip
    assert kueue_reasons({"status": {"conditions": [reserved]}}, None, None) == (True, [])
    assert kueue_reasons({"status": {"admission": {"clusterQueue": "cq"}}}, None, None) == (
        True, []
    )  # fmt: skip


def test_an_admitted_workload_being_preempted_says_so_while_its_pods_stop() -> None:
    """Kueue marks a workload Preempted and Evicted while it still holds its quota (its pods are
    ending): status names the preemptor then, not only once the quota is released (the flake of
    test_a_borrower_is_preempted_when_the_lender_reclaims). Re-admission resets both conditions
    to False (SetQuotaReservation in Kueue 0.19.2's pkg/workload), so no stale line stays."""
    reserved = {"type": "QuotaReserved", "status": "True"}
    why = "Preempted to accommodate a workload due to reclamation; preemptor path: /lab/product"
    preempted = {"type": "Preempted", "status": "True", "reason": "InCohortReclamation",
                 "message": why}  # fmt: skip
    evicted = {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "m"}
    stopping = {"status": {"conditions": [reserved, preempted, evicted]}}
    assert kueue_reasons(stopping, None, None) == (
        True, ["Kueue: preempted (InCohortReclamation) by a workload of ClusterQueue product; "
               "its pods are stopping, then it is requeued"]
    )  # fmt: skip
    assert kueue_reasons({"status": {"conditions": [reserved, evicted]}}, None, None) == (
        True, ["Kueue: evicted (Preempted): m; its pods are stopping"]
    )  # fmt: skip
    readmitted = [reserved, {**preempted, "status": "False"}, {**evicted, "status": "False"}]
    assert kueue_reasons({"status": {"conditions": readmitted}}, None, None) == (True, [])
    job = {"kind": "JobSet", "metadata": {"name": "b"}, "spec": {}, "status": {}}
    status = summarize(job, [pod("b-0", "Running")],
                       workload={"status": {"conditions": [reserved, evicted]}})  # fmt: skip
    assert status.reasons == ["Kueue: evicted (Preempted): m; its pods are stopping"]


def test_an_inactive_cluster_queue_is_named_and_a_queue_with_room_is_not_full() -> None:
    workload = {"spec": {"queueName": "gpus"}, "status": {"conditions": []}}
    local = {"spec": {"clusterQueue": "cq"}}
    stopped = {"type": "Active", "status": "False", "message": "Can't admit new workloads"}
    cq = {"spec": {"resourceGroups": [{"flavors": [{"name": "a30", "resources": [
              {"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]},
          "status": {"conditions": [{"type": "Active", "status": "True"}, stopped],
                     "flavorsUsage": [{"name": "a30", "resources": [
                         {"name": "nvidia.com/gpu", "total": "4"}]}]}}  # fmt: skip
    admitted, reasons = kueue_reasons(workload, local, cq)
    assert admitted is False
    assert reasons == [
        "Kueue: waiting in LocalQueue gpus -> ClusterQueue cq: not yet evaluated",
        "ClusterQueue cq is inactive: Can't admit new workloads",
    ]


def test_a_finished_job_says_its_message_only_if_it_has_one() -> None:
    done = summarize(job([{"type": "Complete", "status": "True"}]), [pod("p", "Succeeded")])
    assert (done.phase, done.reasons) == ("Succeeded", [])
    said = summarize(job([{"type": "Complete", "status": "True", "message": "all done"}]), [])
    assert (said.phase, said.reasons) == ("Succeeded", ["all done"])
    failed = summarize(job([{"type": "Failed", "status": "True"}]), [])
    assert (failed.phase, failed.reasons) == ("Failed", [])


def test_pods_partly_running_are_starting_and_a_plain_suspended_job_says_so() -> None:
    st = summarize(job(), [pod("a", "Running"), pod("b", "Pending")])
    assert (st.phase, st.reasons, st.pods) == ("Starting", [], {"Pending": 1, "Running": 1})
    suspended = summarize(job([{"type": "Suspended", "status": "True"}]), [])
    assert (suspended.phase, suspended.reasons) == (
        "Suspended", ["suspended (spec.suspend is true)"]
    )  # fmt: skip
    queued = summarize(job([{"type": "Suspended", "status": "True"}], {KUEUE_QUEUE_LABEL: "q"}), [])
    assert queued.phase == "Queued" and "suspended (spec.suspend" not in queued.line()


def test_a_podgroup_says_only_its_unschedulable_condition() -> None:
    group = {"metadata": {"name": "pg"}, "status": {"conditions": [
        {"type": "Scheduled", "status": "True", "message": "fine"},
        {"type": "Unschedulable", "status": "True",
         "message": "1/2 tasks unschedulable"}]}}  # fmt: skip
    assert podgroup_reasons(group) == ["Volcano gang (PodGroup pg): 1/2 tasks unschedulable"]


def test_a_pod_that_never_exited_has_no_exit_in_its_line() -> None:
    assert PodState.of(pod("a", "Pending")).line() == "pod a on n1: Pending, restarts 0"


@pytest.mark.parametrize(
    ("replicas", "ready", "pods", "want"),
    [
        (0, 0, [], "ScaledToZero"),
        (2, 2, [pod("a", "Running"), pod("b", "Running")], "Serving"),
        (2, 0, [pod("a", "Pending")], "Starting"),
        (2, 0, [pod("a", "Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                                  "message": "0/1 nodes are available: "
                                                             "1 Insufficient nvidia.com/gpu."}])],
         "Pending"),
    ],
)  # fmt: skip
def test_an_inference_services_deployment_folds_to_its_phase(
    replicas: int, ready: int, pods: list[Obj], want: str
) -> None:
    deployment = {"metadata": {"name": "svc"}, "spec": {"replicas": replicas},
                  "status": {"readyReplicas": ready}}  # fmt: skip
    st = summarize_service(deployment, pods)
    assert st.phase == want
    assert st.reasons[0] == f"{ready}/{replicas} replicas ready"
    assert (len(st.reasons) > 1) is (want == "Pending")  # the scheduler's reason follows


# -- progress, replaced pods, kept logs, cancel -----------------------------------------------


def test_rank_zero_before_its_first_step_time_says_only_its_step() -> None:
    registry = CollectorRegistry()
    JobMetrics("digits", 0, registry, total_steps=100)
    line = progress_line([generate_latest(registry).decode()])
    assert line == "progress: step 0/100 (0 %)"


def test_a_replaced_pod_that_failed_shows_its_exit_code_only() -> None:
    failed = pod("digits-0-a", "Failed", containerStatuses=[
        {"restartCount": 0,
         "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])  # fmt: skip
    assert replaced_note([failed]) == "replaced: pod digits-0-a (exit 1)"


def test_a_job_whose_checkpoints_no_container_mounts_has_no_reader_pod() -> None:
    (obj,) = [o for o in render(validate_training_job(cluster_job()), "job") if o["kind"] == "Job"]
    assert worker_pod_spec(obj) is not None
    for container in obj["spec"]["template"]["spec"]["containers"]:
        container["volumeMounts"] = []  # the checkpoint directory is on no volume
    assert worker_pod_spec(obj) is None
    with pytest.raises(ClusterError) as info:
        reader_pod(obj)
    assert (
        str(info.value) == f"train: no worker pod with {ENV_CHECKPOINT_DIR}; no kept logs to read"
    )


def test_cancelling_what_is_neither_a_job_nor_a_service_is_bad_input() -> None:
    kube = FakeKube()
    with pytest.raises(UserInputError) as info:
        kube.cluster("team-a").cancel("digits")
    assert info.value.errors[0].message == "no gpufleet job 'digits' in namespace team-a"
    assert kube.deleted == []


# -- doctor: what it found missing, or could not read ------------------------------------------


def test_checks_say_what_they_could_not_understand_or_find() -> None:
    facts = healthy()
    facts.version = "latest"
    facts.daemonsets = []
    facts.crds = {k: v for k, v in facts.crds.items() if k not in PROMETHEUS_OPERATOR_CRDS}
    assert facts.kueue_config is not None
    del facts.kueue_config["integrations"]
    got = lines(facts)
    status, text = got["kubernetes"]
    assert status is Status.WARN and text.startswith("version 'latest' not understood (minimum")
    status, text = got["device plugin"]
    assert status is Status.WARN and f"no DaemonSet named *{DEVICE_PLUGIN}*" in text
    status, text = got["prometheus operator"]
    assert status is Status.WARN and PROMETHEUS_OPERATOR_CRDS[0] in text
    assert got["kueue integrations"] == (
        Status.WARN, "integrations.frameworks not set: Kueue's defaults apply | "
    )  # fmt: skip


def test_a_controller_without_a_deployment_is_seen_by_its_webhooks_or_not_at_all() -> None:
    facts = healthy()
    facts.deployments = [d for d in facts.deployments
                         if d["metadata"]["name"] != "training-operator"]  # fmt: skip
    status, text = lines(facts)["training-operator training-operator"]
    assert status is Status.OK and "its webhooks answer" in text
    facts.probes.pop("training-operator")
    status, text = lines(facts)["training-operator training-operator"]
    assert status is Status.WARN and "without leader election cannot be seen" in text


def rdma_tenant_facts() -> Any:
    facts = healthy()
    labels = facts.namespaces[0]["metadata"]["labels"]
    labels.update({LABEL_RDMA: "true", "pod-security.kubernetes.io/enforce": "privileged"})
    facts.crds[NAD_CRD] = {"metadata": {"name": NAD_CRD}, "spec": {"versions": []}}
    return facts


def test_rdma_checks_that_could_not_read_the_policy_or_the_nodes_fail_saying_so() -> None:
    facts = rdma_tenant_facts()
    facts.errors["rdma-policy"] = "list validating admission policy: forbidden"
    assert lines(facts)["rdma"] == (
        Status.FAIL, "list validating admission policy: forbidden | run doctor with credentials "
        "that may list them (cluster admin)"
    )  # fmt: skip
    del facts.errors["rdma-policy"]
    facts.rdma_policy = True
    facts.errors["nodes"] = "list node: forbidden"
    assert lines(facts)["rdma"][:1] == (Status.FAIL,)
    assert lines(facts)["rdma"][1].startswith("list node: forbidden | ")
