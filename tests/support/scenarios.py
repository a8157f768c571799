"""The recorded cluster scenarios (tests/fixtures/cluster/*.yaml: a job, its pods, events and
Kueue or Volcano objects as the API server gave them), and a FakeKube holding one of them with
the client connected to its namespace."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.cluster import Cluster
from gpufleet.kube import LABEL_JOB
from tests.support.fake_kube import FakeKube
from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "cluster"


def scenario(name: str) -> dict[str, Any]:
    """One recorded scenario's objects by key: job, pods, events, and workload, localQueue,
    clusterQueue or podgroup where it has them."""
    return yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())  # type: ignore[no-any-return]


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
    """The client on ``kube``, in the scenarios' namespace (team-a)."""
    return kube.cluster("team-a")


def cli_on(kube: FakeKube, monkeypatch: Any) -> None:
    """Make the CLI's ``Cluster.connect`` answer ``kube`` (in the namespace asked for, else the
    scenarios' team-a), as a kubeconfig's cluster would."""
    connect = classmethod(lambda cls, ns=None, ctx=None: kube.cluster(ns or "team-a"))
    monkeypatch.setattr("gpufleet.cluster.Cluster.connect", connect)
