"""`gpufleet status` of a job whose controller replaced a pod (a Job's pod that exited 75 is
left Failed beside its replacement): the job's current pods, its phase and progress, and one
word on the replaced pod (seen on real nodes: "Starting, pods 2/3 Running" and no progress)."""

from __future__ import annotations

from typing import Any

from gpufleet.cluster.replaced import replaced_note, split_replaced
from tests.support.scenarios import connect, kube_of
from tests.unit.test_job_progress import pod_text


def pod(name: str, prefix: str, created: str, phase: str, exit_code: int | None = None) -> Any:
    state = {"terminated": {"exitCode": exit_code, "reason": "Error"}} if exit_code else {}
    return {"metadata": {"name": name, "generateName": prefix, "creationTimestamp": created},
            "status": {"phase": phase, "containerStatuses": [{"name": "worker", "state": state,
                                                              "restartCount": 0}]}}  # fmt: skip


def test_a_failed_pod_with_a_newer_one_of_its_index_is_replaced_and_no_other() -> None:
    old = pod("split-1-aaaaa", "split-1-", "2026-11-26T10:00:00Z", "Failed", 75)
    new = pod("split-1-bbbbb", "split-1-", "2026-11-26T10:01:00Z", "Running")
    zero = pod("split-0-ccccc", "split-0-", "2026-11-26T10:00:00Z", "Running")
    alone = pod("other-0-ddddd", "other-0-", "2026-11-26T10:00:00Z", "Failed", 1)
    named = {"metadata": {"name": "digits-worker-0"}, "status": {"phase": "Failed"}}
    current, replaced = split_replaced([zero, old, new, alone, named])
    assert replaced == [old] and current == [zero, new, alone, named]
    assert replaced_note(replaced) == (
        "replaced: pod split-1-aaaaa (exit 75: preempted or lost its rendezvous host, not counted)"
    )
    assert replaced_note([]) is None


def test_a_failed_pod_replaced_by_one_that_failed_later_is_replaced_and_that_one_not() -> None:
    first = pod("j-0-a", "j-0-", "2026-11-26T10:00:00Z", "Failed", 1)
    second = pod("j-0-b", "j-0-", "2026-11-26T10:00:30Z", "Failed", 1)
    assert split_replaced([first, second]) == ([second], [first])


def test_status_runs_on_its_current_pods_and_names_the_replaced_one() -> None:
    kube = kube_of("running")
    for p in kube.pods():
        p["metadata"]["generateName"] = p["metadata"]["name"][:-1]
        p["metadata"]["creationTimestamp"] = "2026-11-26T10:01:00Z"
        ports = [{"name": "metrics", "containerPort": 9410}]
        p["spec"] = {"containers": [{"name": "pytorch", "ports": ports}]}
    gone = pod("digits-worker-x", "digits-worker-", "2026-11-26T10:00:00Z", "Failed", 75)
    kube.put({"apiVersion": "v1", "kind": "Pod", **gone,
              "metadata": {**gone["metadata"], "namespace": "team-a",
                           "labels": kube.pods()[0]["metadata"]["labels"]}})  # fmt: skip
    kube.metrics["digits-worker-0"] = pod_text(0, 40, total=100, checkpoint=30)
    status = connect(kube).status("digits")
    line = status.line()
    assert line.startswith("digits (PyTorchJob): Running, pods 2/2 Running; progress: step 40"), (
        line
    )
    assert line.endswith("replaced: pod digits-worker-x (exit 75: preempted or lost its "
                         "rendezvous host, not counted)"), line  # fmt: skip
    assert [s.name for s in status.pod_states][-1] == "digits-worker-x"
