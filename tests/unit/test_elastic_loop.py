"""The elastic controller's loop over the API (gpufleet.cluster.elastic_loop), on the recorded-
objects stand-in: a round patches the Job it decided on with the resourceVersion it read, a Job
changed since (409) is left for the next round, and a refused read is one line while the loop
goes on. Against the real API server and Kueue: tests/cluster/test_devcluster_queues_elastic.py."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import pytest

from gpufleet.cluster.elastic_loop import one_round, run
from gpufleet.cluster.resizes import resizes
from gpufleet.kube import Obj
from tests.support.fake_kube import FakeKube
from tests.unit.test_elastic import ADMITTED, LOCAL_QUEUES, job, lab

NOW = dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC)


def kube_with(research: int, product: int) -> FakeKube:
    kube = FakeKube()
    elastic = job(1) | {"apiVersion": "batch/v1", "kind": "Job"}
    elastic["metadata"] = {
        **elastic["metadata"],
        "resourceVersion": "7",
        "labels": {**elastic["metadata"]["labels"], "gpufleet.dev/job": "e"},
    }
    kube.put(elastic)
    kube.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", **ADMITTED})
    for q in LOCAL_QUEUES:
        kube.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", **q})
    for q in lab(research, product).values():
        kube.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", **q})
    return kube


def stored(kube: FakeKube) -> Obj:
    return kube.objects[("batch", "v1", "research", "jobs", "e")]


def test_a_round_patches_the_job_it_read(capsys: pytest.CaptureFixture[str]) -> None:
    kube = kube_with(research=4, product=0)
    (made,) = one_round(kube.api("CustomObjectsApi"), NOW)
    assert (made.old, made.new) == (1, 2)
    assert len(kube.called("patch_namespaced_custom_object")) == 1
    job_now = stored(kube)
    assert job_now["spec"]["parallelism"] == job_now["spec"]["completions"] == 2
    assert resizes(job_now)[0]["cause"] == "quota freed in cohort lab"
    assert "research/e grew 1→2 (quota freed in cohort lab)" in capsys.readouterr().out
    assert one_round(kube.api("CustomObjectsApi"), NOW) == []  # at spec.nodes now


def test_a_job_changed_since_it_was_read_waits_for_the_next_round(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = kube_with(research=4, product=0)
    real = kube.list_cluster_custom_object

    def stale(group: str, version: str, plural: str, **kw: Any) -> Obj:
        listed = real(group, version, plural, **kw)
        if plural == "jobs":  # what was read, before someone else's update
            listed = json.loads(json.dumps(listed))
            stored(kube)["metadata"]["resourceVersion"] = "8"
        return listed

    monkeypatch.setattr(kube, "list_cluster_custom_object", stale)
    assert one_round(kube.api("CustomObjectsApi"), NOW) == []
    assert stored(kube)["spec"]["parallelism"] == 1
    said = capsys.readouterr().err
    assert said.startswith("gpufleet elastic: resize Job research/e: changed since it was"), said
    assert "already exists" not in said and "the object has been modified" in said


class _Twice(threading.Event):
    """Set once two rounds have asked."""

    asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > 2


def test_a_refused_read_is_one_line_and_the_loop_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kube = kube_with(research=4, product=0)
    kube.fail_with = 403
    run(kube.api("CustomObjectsApi"), _Twice(), interval=0.01)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all("forbidden (RBAC)" in line for line in lines), lines
