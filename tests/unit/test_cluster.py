"""``gpufleet status`` from recorded API objects, and the client's calls against a stand-in API.

No cluster runs here, so the client talks to ``RecordedApi``: it serves the objects of one
recorded scenario (tests/fixtures/cluster/*.yaml) through the same method names and
parameters as kubernetes.client.CustomObjectsApi and CoreV1Api (checked below).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cluster import JOB_KINDS, Cluster, explain_scheduling, summarize
from gpufleet.cluster.client import CLUSTER_QUEUES, LOCAL_QUEUES, PODGROUPS, WORKLOADS
from gpufleet.errors import EXIT_BAD_INPUT, GpufleetError
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.conftest import REPO
from tests.unit.test_render import cluster_job

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


class ApiError(Exception):
    """What kubernetes.client.ApiException carries that the client reads."""

    def __init__(self, status: int, body: str = "") -> None:
        super().__init__(f"({status})")
        self.status, self.body = status, body


KINDS = {(k.group, k.version, k.plural) for k in [*JOB_KINDS, WORKLOADS, LOCAL_QUEUES,
                                                     CLUSTER_QUEUES, PODGROUPS]}  # fmt: skip


class RecordedApi:
    """CustomObjectsApi + CoreV1Api over an in-memory set of objects."""

    def __init__(self, objects: dict[tuple[str, ...], dict[str, Any]] | None = None) -> None:
        self.objects = objects or {}
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.services: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    @classmethod
    def of(cls, name: str) -> RecordedApi:
        s = scenario(name)
        api = cls()
        recorded = [
            ("job", None),
            ("workload", WORKLOADS),
            ("localQueue", LOCAL_QUEUES),
            ("clusterQueue", CLUSTER_QUEUES),
            ("podgroup", PODGROUPS),
        ]
        for key, plural_kind in recorded:
            obj = s.get(key)
            if obj is None:
                continue
            kind = plural_kind or next(
                k for k in JOB_KINDS
                if k.api_version == obj["apiVersion"] and k.kind == obj["kind"]
            )  # fmt: skip
            ns = obj["metadata"].get("namespace", "")
            api.objects[(kind.group, kind.version, ns, kind.plural, obj["metadata"]["name"])] = obj
        api.pods, api.events = s["pods"], s["events"]
        return api

    # CustomObjectsApi
    def get_namespaced_custom_object(self, group, version, namespace, plural, name):  # type: ignore[no-untyped-def]
        assert (group, version, plural) in KINDS
        try:
            return self.objects[(group, version, namespace, plural, name)]
        except KeyError:
            raise ApiError(404) from None

    def get_cluster_custom_object(self, group, version, plural, name):  # type: ignore[no-untyped-def]
        return self.get_namespaced_custom_object(group, version, "", plural, name)

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=None):  # type: ignore[no-untyped-def]
        items = [o for (g, v, ns, p, _), o in self.objects.items()
                 if (g, v, ns, p) == (group, version, namespace, plural)]  # fmt: skip
        if label_selector:
            key, value = label_selector.split("=")
            items = [o for o in items if o["metadata"].get("labels", {}).get(key) == value]
        return {"items": items}

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):  # type: ignore[no-untyped-def]
        key = (group, version, namespace, plural, body["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists")
        self.objects[key] = body

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None):  # type: ignore[no-untyped-def]
        del self.objects[(group, version, namespace, plural, name)]
        self.deleted.append(f"{plural}/{name}")

    # CoreV1Api
    def list_namespaced_pod(self, namespace, label_selector=None):  # type: ignore[no-untyped-def]
        assert label_selector == "gpufleet.dev/job=digits"
        return {"items": self.pods}

    def list_namespaced_event(self, namespace, field_selector=None):  # type: ignore[no-untyped-def]
        name = field_selector.rsplit("involvedObject.name=", 1)[1]
        return {"items": [e for e in self.events if e["involvedObject"]["name"] == name]}

    def read_namespaced_pod_log(self, name, namespace, tail_lines=None):  # type: ignore[no-untyped-def]
        lines = [f"{name} line {i}" for i in range(5)]
        return "\n".join(lines[-tail_lines:] if tail_lines else lines)

    def create_namespaced_service(self, namespace, body):  # type: ignore[no-untyped-def]
        self.services[body["metadata"]["name"]] = body

    def list_namespaced_service(self, namespace, label_selector=None):  # type: ignore[no-untyped-def]
        return {"items": list(self.services.values())}

    def delete_namespaced_service(self, name, namespace):  # type: ignore[no-untyped-def]
        del self.services[name]
        self.deleted.append(f"services/{name}")


def test_recorded_api_has_the_real_clients_signatures() -> None:
    """The stand-in must not drift from kubernetes.client: same methods, same positionals."""

    def required(fn: Any) -> list[str]:
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        return [
            p.name for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]

    checked = 0
    for name, method in inspect.getmembers(RecordedApi, inspect.isfunction):
        if name.startswith("_"):
            continue
        real = getattr(k8s.CustomObjectsApi, name, None) or getattr(k8s.CoreV1Api, name)
        assert required(method) == required(real), name
        checked += 1
    assert checked == 11


def test_status_follows_workload_to_cluster_queue() -> None:
    cluster = Cluster(*(2 * [RecordedApi.of("kueue-quota")]), namespace="team-a")
    st = cluster.status("digits")
    assert st.phase == "Queued" and "ClusterQueue team-a is full" in st.line()


def test_status_reads_scheduler_events_of_pending_pods() -> None:
    api = RecordedApi.of("unschedulable")
    api.pods[1]["status"]["conditions"] = []  # only the event explains pod 0; pod 1 says nothing
    st = Cluster(api, api, namespace="team-a").status("digits")
    assert "pod digits-0-7xk2p unschedulable" in st.line()


def test_status_volcano_podgroup() -> None:
    api = RecordedApi.of("volcano-gang")
    st = Cluster(api, api, namespace="team-a").status("digits")
    assert "Volcano gang" in st.line()


def test_unknown_job_is_bad_input() -> None:
    api = RecordedApi()
    with pytest.raises(GpufleetError) as info:
        Cluster(api, api, namespace="team-a").status("digits")
    assert info.value.exit_code == EXIT_BAD_INPUT


def test_submit_then_cancel_removes_everything() -> None:
    api = RecordedApi()
    cluster = Cluster(api, api, namespace="team-a")
    job = validate_training_job(cluster_job() | {"metadata": {"name": "digits"}})
    assert cluster.submit(render(job, "job")) == ["Service/digits", "Job/digits"]
    assert ("batch", "v1", "team-a", "jobs", "digits") in api.objects
    with pytest.raises(GpufleetError, match="already exists"):
        cluster.submit(render(job, "job")[1:])
    assert cluster.cancel("digits") == ["Job/digits", "Service/digits"]
    assert not api.objects and not api.services


def test_logs_prefix_each_pod() -> None:
    api = RecordedApi.of("running")
    lines = list(Cluster(api, api, namespace="team-a").logs("digits", tail=2))
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
