"""The Ray job's parts that need no Ray cluster: the spec's rules for spec.framework ray, its
driver and environment, its RayJob, and its checkpoints' marker (Ray Train's run is
tests/integration/test_ray.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.cluster.phases import job_phase
from gpufleet.frameworks.ray.cluster import ray_env
from gpufleet.frameworks.ray.driver import absolute
from gpufleet.frameworks.ray.train import RayCheckpoints
from gpufleet.launch.worker import job_context, worker_module_args
from gpufleet.render import check_restricted, pod_specs_in, render_spec
from gpufleet.runtime import integrity
from gpufleet.spec import validate_training_job
from tests.support.cli import run_cli
from tests.support.specs import digits_job, write_spec
from tests.unit.test_spec import errors_of


def ray_job(**spec: Any) -> dict[str, Any]:
    return digits_job("ray-digits", framework="ray", **spec)


@pytest.mark.parametrize(
    ("spec", "path", "text"),
    [
        ({"workload": {"name": "synthetic"}}, "spec.workload.name", "no ray version"),
        ({"parallelism": {"strategy": "fsdp"}}, "spec.parallelism", "Ray Train's DDP"),
        ({"nodes": 2, "minNodes": 1}, "spec.minNodes", "fixed number of workers"),
        ({"onNonFinite": "rollback"}, "spec.onNonFinite", "rollback is the PyTorch"),
        ({"checkpoint": {"dir": "s3://b/c"}}, "spec.checkpoint.dir", "not an object store"),
        ({"checkpoint": {"async": True}}, "spec.checkpoint.async", "saves synchronously"),
    ],
)
def test_what_a_ray_job_cannot_have_is_refused_with_its_path(
    spec: dict[str, Any], path: str, text: str
) -> None:
    doc = ray_job()
    doc["spec"].update(spec)
    errs = errors_of(doc)
    assert text in errs.get(path, ""), errs


def test_a_ray_job_runs_its_driver_with_several_workers_a_node() -> None:
    """Unlike TensorFlow's one worker a node, procsPerNode Ray Train workers share a node."""
    job = validate_training_job(ray_job(nodes=2, procsPerNode=2))
    assert worker_module_args(job)[-2:] == ["-m", "gpufleet.frameworks.ray"]
    context = absolute(job_context(job, Path("rel/run")))
    assert context.run_dir.is_absolute() and Path(context.checkpoint_root).is_absolute()
    assert context.checkpoint_root == str(context.run_dir / "checkpoints")


def test_the_cluster_authenticates_with_a_token_and_keeps_it_out_of_files() -> None:
    env = ray_env("t0k3n")
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "t0k3n"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"


def test_a_ray_job_renders_to_a_rayjob_only(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, ray_job(), "ray.yaml")
    done = run_cli("render", str(spec), "--target", "job", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        "spec.framework: is ray, but target job runs pytorch or tensorflow workers; a ray "
        "job renders to rayjob" in done.stderr
    ), done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_rayjob_is_one_fixed_cluster_whose_head_runs_the_driver() -> None:
    """Kueue's ray.io/rayjob needs a fixed worker group and the cluster deleted at the end;
    HTTPMode adds no submitter pod; every pod passes restricted; the head asks no GPU."""
    from tests.support.specs import cluster_job

    doc = cluster_job(target="rayjob", nodes=3, resources={"gpu": 2, "cpu": "2", "memory": "4Gi"})
    doc["spec"]["procsPerNode"] = 2  # Ray Train workers share a node
    (rayjob,) = render_spec(validate_training_job(doc), "rayjob")
    spec = rayjob["spec"]
    assert spec["submissionMode"] == "HTTPMode" and spec["shutdownAfterJobFinishes"] is True
    assert spec["entrypoint"] == "python -m gpufleet.launch.shim -m gpufleet.frameworks.ray"
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    assert group["rayStartParams"] == {"num-cpus": "2", "num-gpus": "2"}
    assert "enableInTreeAutoscaling" not in spec["rayClusterSpec"]
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    assert [e for _, pod in pod_specs_in(rayjob) for e in check_restricted(pod)] == []
    (container,) = head["template"]["spec"]["containers"]
    assert "command" not in container  # KubeRay's ray start
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}  # no GPU
    assert {"name": "dashboard", "containerPort": 8265} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUFLEET_RAY_WORKERS"] == "6" and env["GPUFLEET_RAY_USE_GPU"] == "1"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"


def test_a_ray_checkpoint_marked_in_scratch_verifies_where_ray_copies_it(tmp_path: Path) -> None:
    """Worker 0 marks the directory before Ray copies it: the marker's digests hold there."""
    import shutil

    import fsspec

    store = RayCheckpoints(str(tmp_path / "root"), every_steps=10, keep=2,
                           identity={"job": "j"}, chief=True, log=print)  # fmt: skip
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "state.pt").write_bytes(b"weights")
    store.mark(scratch, 10, world_size=2, seconds=0.1)
    copied = store.root / store.new_name(10)
    shutil.copytree(scratch, copied)
    assert store.newest_usable(2) == copied
    fs = fsspec.filesystem("file")
    assert integrity.verify(fs, str(copied), integrity.read_marker(fs, str(copied))) == []
    with pytest.raises(Exception, match="a Ray job resumes on its own number of workers"):
        store.newest_usable(4)


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, "Succeeded"),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "FAILED"}, "Failed"),
        ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}, "Failed"),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, "Running"),
        ({"jobDeploymentStatus": "Initializing"}, "Pending"),
        ({"jobDeploymentStatus": "Suspended"}, "Suspended"),
    ],
)
def test_a_rayjobs_phase_is_read_from_kuberays_deployment_and_job_status(
    status: dict[str, str], phase: str
) -> None:
    """KubeRay reports a RayJob in status.jobDeploymentStatus and jobStatus, not conditions;
    a completed deployment whose Ray job failed is a failed job."""
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": "r", "namespace": "a"}, "status": status}  # fmt: skip
    assert job_phase(rayjob)[0] == phase
