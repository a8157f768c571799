"""The client's submit, cancel and logs against a stand-in API (``FakeKube``,
tests/support/fake_kube.py, holding recorded scenarios: tests/support/scenarios.py): what it
creates and removes, a refused object that leaves nothing half applied, a queued job without its
LocalQueue or without Kueue, API errors as one line (and a bug of ours as itself), and the CLI
without a cluster or with a namespace flag that contradicts the spec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cluster import ClusterError
from gpufleet.errors import EXIT_BAD_INPUT, GpufleetError, UserInputError
from gpufleet.render import render
from gpufleet.spec import validate_training_job
from tests.support.fake_kube import FakeKube
from tests.support.paths import REPO
from tests.support.scenarios import connect, kube_of
from tests.support.specs import cluster_job


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
