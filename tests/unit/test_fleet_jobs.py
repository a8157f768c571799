"""`gpufleet jobs` on a cluster: every recorded scenario's job in one fleet, read with one list
per kind, each row saying what `gpufleet status` says of its job; progress from the running
pods' metrics; restarts; the rows as the CLI prints them."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cluster.fleet import Fleet, read_fleet, read_visible
from gpufleet.cluster.jobrows import WAITING, age, evictions, group_restarts, row_of
from gpufleet.cluster.kinds import JOB_KINDS
from gpufleet.errors import ClusterError
from gpufleet.kube import LABEL_JOB
from gpufleet.render import TARGETS
from tests.support.fake_kube import FakeKube
from tests.support.scenarios import cli_on, connect, kube_of, scenario
from tests.unit.test_job_progress import pod_text

SCENARIOS = ["failed", "image-pull", "kueue-quota", "no-gpufleet", "no-localqueue", "running",
             "unschedulable", "volcano-gang"]  # fmt: skip
NOW = dt.datetime(2026, 11, 20, 10, 30, tzinfo=dt.UTC)


def renamed(obj: Any, name: str) -> Any:
    """``obj`` with the scenario's job name "digits" replaced by ``name`` everywhere (names,
    labels, owner references, events) and its UIDs made unique."""
    text = json.dumps(obj).replace("digits", name).replace("6f1c0e1a-", f"{name}-")
    return json.loads(text)


def fleet_kube() -> FakeKube:
    """Every scenario's objects in one store, each job named after its scenario, half of
    them in a second namespace; plus a JobSet's child Job, which carries the job's labels."""
    kube = FakeKube()
    for i, name in enumerate(SCENARIOS):
        single = kube_of(name)
        for obj in single.objects.values():
            obj = renamed(copy.deepcopy(obj), name)
            if i % 2 and obj["kind"] not in ("ClusterQueue",):
                obj["metadata"]["namespace"] = "team-b"
            kube.put(obj)
        kube.events += [renamed(e, name) for e in single.events]
    child = renamed(copy.deepcopy(scenario("failed")["job"]), "kueue-quota-workers-0")
    child["metadata"]["labels"][LABEL_JOB] = "kueue-quota"
    child["metadata"]["ownerReferences"] = [{"kind": "JobSet", "name": "kueue-quota",
                                             "controller": True, "uid": "x"}]  # fmt: skip
    kube.put(child)
    return kube


def test_every_job_is_one_row_saying_what_status_says_of_it() -> None:
    kube = fleet_kube()
    fleet = read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), None)
    rows = {r.name: r for r in (row_of(fleet, k, j, NOW) for k, j in fleet.jobs)}
    assert sorted(rows) == sorted(SCENARIOS)  # the JobSet's child Job is not a job of its own
    for name, row in rows.items():
        single = connect(kube_of(name)).status("digits")
        assert row.phase == single.phase, name
        assert row.line == renamed(single.line(), name), name
        waiting = single.phase in WAITING
        assert row.reason == (renamed(single.reasons[0], name) if waiting else None), name
    assert rows["kueue-quota"].target == "jobset" and rows["kueue-quota"].queue == "team-a"
    assert rows["volcano-gang"].target == "volcano" and rows["running"].target == "pytorchjob"
    assert rows["kueue-quota"].namespace == "team-a" and rows["image-pull"].namespace == "team-b"


def test_the_fleet_is_one_list_per_kind_however_many_jobs() -> None:
    """Reading 8 jobs makes the same calls as reading 1: a list per kind, no get per job."""
    few, many = kube_of("volcano-gang"), fleet_kube()  # Volcano: its PodGroups listed too
    for kube in (few, many):
        read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), None)
    assert [name for name, _ in few.calls] == [name for name, _ in many.calls]
    assert not [name for name, _ in many.calls if name.startswith(("get_", "read_"))]


def test_one_namespace_shows_only_its_jobs() -> None:
    kube = fleet_kube()
    fleet = read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), "team-b")
    names = sorted(j["metadata"]["name"] for _, j in fleet.jobs)
    assert names == sorted(SCENARIOS[1::2])


def test_a_running_jobs_row_has_its_progress_and_time_to_go() -> None:
    kube = kube_of("running")
    fleet = read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), "team-a")
    kind, job = fleet.jobs[0]
    row = row_of(fleet, kind, job, NOW, [pod_text(0, 40, total=100, checkpoint=30)])
    assert (row.step, row.steps, row.eta_seconds) == (40, 100, 30.0)  # 60 steps of 0.5 s
    assert row_of(fleet, kind, job, NOW).step is None  # no metrics read: no progress


def test_restarts_count_container_restarts_replaced_pods_and_kueue_evictions() -> None:
    kube = kube_of("running")
    pods = kube.pods()
    pods[0]["status"]["containerStatuses"][0]["restartCount"] = 2
    for pod in pods:  # the Job controller's names: a replaced pod has a newer sibling
        pod["metadata"]["generateName"] = pod["metadata"]["name"] + "-"
    gone = copy.deepcopy(pods[1])
    gone["metadata"].update(name="digits-worker-0-old", creationTimestamp="2026-11-20T09:00:00Z")
    gone["status"] = {"phase": "Failed"}
    kube.put({"apiVersion": "v1", "kind": "Pod", **gone})
    owner = {"uid": scenario("running")["job"]["metadata"]["uid"]}
    stats = {"evictions": [{"reason": "Preempted", "count": 3}]}
    kube.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
              "metadata": {"name": "wl", "namespace": "team-a", "ownerReferences": [owner]},
              "status": {"admission": {"clusterQueue": "q"},
                         "schedulingStats": stats}})  # fmt: skip
    fleet = read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), "team-a")
    assert row_of(fleet, *fleet.jobs[0], NOW).restarts == 2 + 1 + 3


def test_a_jobsets_group_restarts_and_volcanos_retries_count() -> None:
    assert group_restarts({"status": {"restarts": 2}}) == 2
    assert group_restarts({"status": {"retryCount": 1}}) == 1 and group_restarts({}) == 0


def test_a_refused_childs_event_belongs_to_the_job_with_the_longest_matching_name() -> None:
    """Job "a" must not take the FailedCreate of "a-b"'s child Job "a-b-workers-0"."""
    jobs = [(JOB_KINDS[0], {"metadata": {"name": n, "namespace": "t"}}) for n in ("a", "a-b")]
    event = {"metadata": {"namespace": "t"}, "reason": "FailedCreate",
             "involvedObject": {"kind": "Job", "name": "a-b-workers-0"}}  # fmt: skip
    fleet = Fleet(jobs=jobs, events=[event])
    assert fleet.events_of(jobs[0][1], []) == [] and fleet.events_of(jobs[1][1], []) == [event]


def test_every_job_kinds_target_is_a_renderers() -> None:
    assert sorted(k.target for k in JOB_KINDS) == sorted(TARGETS)


def test_evictions_fall_back_to_the_requeue_count() -> None:
    assert evictions({"status": {"requeueState": {"count": 2}}}) == 2
    assert evictions(None) == 0


@pytest.mark.parametrize("seconds, text", [(None, "-"), (45, "45s"), (119, "119s"), (600, "10m"),
                                           (3 * 3600, "3h"), (5 * 86400, "5d")])  # fmt: skip
def test_ages_read_like_kubectls(seconds: float | None, text: str) -> None:
    assert age(seconds) == text


def test_the_cli_prints_a_row_per_job_and_the_waiting_ones_reasons_in_80_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = fleet_kube()
    cli_on(kube, monkeypatch)
    result = CliRunner().invoke(app, ["jobs", "-A"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "TARGET", "QUEUE", "PHASE", "PROGRESS",
                                "RESTARTS", "AGE"]  # fmt: skip
    assert all(len(line.rstrip()) <= 80 for line in lines), result.stdout
    assert "Waiting:" in lines
    waiting = " ".join(lines[lines.index("Waiting:") :])
    assert "team-a/kueue-quota: Kueue: waiting in LocalQueue team-a" in waiting
    data = json.loads(CliRunner().invoke(app, ["jobs", "-n", "team-b", "-o", "json"]).stdout)
    assert data["namespace"] == "team-b"
    assert sorted(r["name"] for r in data["jobs"]) == sorted(SCENARIOS[1::2])
    assert {"etaSeconds", "ageSeconds", "reason", "line"} <= set(data["jobs"][0])


def test_a_kind_without_its_crd_is_skipped_and_unreadable_queues_are_none() -> None:
    kube = fleet_kube()
    kube.refuse = {"jobs.batch.volcano.sh": 404, "clusterqueues.kueue.x-k8s.io": 403}
    fleet = read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), None)
    assert "volcano-gang" not in {j["metadata"]["name"] for _, j in fleet.jobs}
    assert fleet.cluster_queues is None and len(fleet.jobs) == len(SCENARIOS) - 1


def test_a_refused_list_across_namespaces_falls_back_to_the_callers() -> None:
    kube = fleet_kube()
    kube.refuse = {"workloads.kueue.x-k8s.io": 403}  # namespaced lists are allowed
    fleet, note = read_visible(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), "team-b",
                               all_namespaces=True)  # fmt: skip
    assert note is not None and "namespace team-b only" in note
    assert sorted(j["metadata"]["name"] for _, j in fleet.jobs) == sorted(SCENARIOS[1::2])
    kube.refuse = {"pods": 500}
    with pytest.raises(ClusterError, match="list pods"):
        read_fleet(kube.api("CustomObjectsApi"), kube.api("CoreV1Api"), "team-b")
