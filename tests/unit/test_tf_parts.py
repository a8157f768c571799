"""The TensorFlow job's parts that need no TensorFlow: the spec's rules for spec.framework,
TF_CONFIG from the launcher's environment, and the checkpoint directories with their markers
(real files, written by a stand-in for tf.train.Checkpoint.write)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import CheckpointMismatchError, NoUsableCheckpointError, UserInputError
from gpufleet.frameworks.tf import checkpoints as ckpt
from gpufleet.frameworks.tf.checkpoints import PREFIX, TfCheckpoints
from gpufleet.frameworks.tf.cluster import ClusterConfigError, local_workers, pod_workers, tf_config
from gpufleet.launch.worker import FRAMEWORK_MODULES, worker_env, worker_module_args
from gpufleet.render import FRAMEWORK_TARGETS, TARGETS, check_restricted, pod_specs_in, render
from gpufleet.runtime import integrity
from gpufleet.spec import validate_training_job
from gpufleet.spec.training_rules import FRAMEWORK_WORKLOADS, FRAMEWORKS
from tests.support.specs import cluster_job, digits_job, pod_templates
from tests.unit.test_spec import errors_of


def tf_job(**spec: Any) -> dict[str, Any]:
    return digits_job("tf-digits", framework="tensorflow", procsPerNode=1, **spec)


@pytest.mark.parametrize(
    ("spec", "path", "text"),
    [
        ({"procsPerNode": 2}, "spec.procsPerNode", "runs one worker per node"),
        ({"workload": {"name": "synthetic"}}, "spec.workload.name", "no tensorflow version"),
        ({"parallelism": {"strategy": "fsdp"}}, "spec.parallelism", "is PyTorch's"),
        ({"nodes": 2, "minNodes": 1}, "spec.minNodes", "fixed number of workers"),
        ({"onNonFinite": "rollback"}, "spec.onNonFinite", "rollback is the PyTorch"),
        ({"checkpoint": {"dir": "s3://b/c"}}, "spec.checkpoint.dir", "not an object store"),
        ({"checkpoint": {"async": True}}, "spec.checkpoint.async", "saves synchronously"),
        ({"framework": "jax"}, "spec.framework", "'pytorch', 'tensorflow', 'ray' or 'horovod'"),
    ],
)
def test_what_a_tensorflow_job_cannot_have_is_refused_with_its_path(
    spec: dict[str, Any], path: str, text: str
) -> None:
    doc = tf_job()
    doc["spec"].update(spec)
    errs = errors_of(doc)
    assert text in errs.get(path, ""), errs


def test_a_tensorflow_job_runs_its_own_worker_and_pytorch_stays_the_default() -> None:
    job = validate_training_job(tf_job(nodes=2))
    assert job.spec.framework == "tensorflow"
    assert worker_module_args(job)[-2:] == ["-m", "gpufleet.frameworks.tf"]
    assert worker_env(job, Path("/run"))["GPUFLEET_FRAMEWORK"] == "tensorflow"
    pytorch = validate_training_job(digits_job())
    assert pytorch.spec.framework == "pytorch"
    assert worker_module_args(pytorch)[-2:] == ["-m", "gpufleet.workloads"]
    assert "GPUFLEET_FRAMEWORK" not in worker_env(pytorch, Path("/run"))


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob", "mpijob", "volcano"])
def test_a_tensorflow_job_is_refused_by_the_targets_that_run_pytorch(target: str) -> None:
    job = validate_training_job(cluster_job(target="tfjob", nodes=2))
    with pytest.raises(UserInputError) as info:
        render(job, target)
    (error,) = info.value.errors
    assert error.path == "spec.framework"
    runs = "pytorch or horovod" if target == "mpijob" else "pytorch"
    assert f"target {target} runs {runs} workers" in error.message
    assert "renders to job, jobset, tfjob" in error.message
    with pytest.raises(UserInputError, match="target tfjob runs tensorflow workers"):
        render(validate_training_job(cluster_job(nodes=2)), "tfjob")


@pytest.mark.parametrize(
    ("target", "hosts"),
    [
        ("job", ["train-0.train:2222", "train-1.train:2222"]),
        ("jobset", ["train-worker-0-0.train:2222", "train-worker-0-1.train:2222"]),
        ("tfjob", None),  # the operator's own TF_CONFIG
    ],
)
def test_each_tensorflow_target_tells_its_workers_where_every_worker_is(
    target: str, hosts: list[str] | None
) -> None:
    job = validate_training_job(cluster_job(target="tfjob", nodes=2))
    objects = render(job, target)
    assert all(check_restricted(pod) == [] for obj in objects for _, pod in pod_specs_in(obj))
    (template,) = [t for obj in objects for t in pod_templates(obj)]
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUFLEET_FRAMEWORK"] == "tensorflow"
    assert env.get("GPUFLEET_TF_WORKERS") == (",".join(hosts) if hosts else None)
    assert container["command"][-2:] == ["-m", "gpufleet.frameworks.tf"]
    assert "--nproc-per-node=1" in container["command"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if target == "tfjob":
        (tfjob,) = objects
        worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
        assert worker["replicas"] == 2 and container["name"] == "tensorflow"
        assert ports["tfjob-port"] == 2222 and ports["rdzv"] == 29400
        assert "--rdzv-endpoint=train-worker-0:29400" in container["command"]


def test_tf_config_from_the_launchers_addresses_and_the_workers_index() -> None:
    workers = local_workers([2001, 2002])
    assert tf_config({"GPUFLEET_TF_WORKERS": workers, "RANK": "1"}) == {
        "cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]},
        "task": {"type": "worker", "index": 1},
    }
    # A pod's completion index wins over torchrun's rank (ranks follow rendezvous order), and
    # the launcher's own index over both.
    pods = pod_workers(["j-0.j", "j-1.j"])
    got = tf_config({"GPUFLEET_TF_WORKERS": pods, "JOB_COMPLETION_INDEX": "0", "RANK": "1"})
    assert got == {"cluster": {"worker": ["j-0.j:2222", "j-1.j:2222"]},
                   "task": {"type": "worker", "index": 0}}  # fmt: skip
    got = tf_config({"GPUFLEET_TF_WORKERS": pods, "GPUFLEET_TF_INDEX": "1",
                     "JOB_COMPLETION_INDEX": "0", "RANK": "0"})  # fmt: skip
    assert got is not None and got["task"]["index"] == 1
    # A TFJob's TF_CONFIG is used as given; one around `gpufleet run` is not this job's.
    given = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    assert tf_config({"TF_CONFIG": json.dumps(given)}) == given
    mine = tf_config({"TF_CONFIG": json.dumps(given), "GPUFLEET_TF_WORKERS": pods, "RANK": "1"})
    assert mine is not None and mine["cluster"]["worker"] == ["j-0.j:2222", "j-1.j:2222"]
    assert tf_config({"RANK": "0"}) is None  # one worker, no cluster


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ({"TF_CONFIG": "{not json"}, "TF_CONFIG is not JSON"),
        ({"GPUFLEET_TF_WORKERS": "a:1,b:1", "RANK": "2"}, "'2' ("),
        ({"GPUFLEET_TF_WORKERS": "a:1,b:1"}, "None ("),
    ],
)
def test_a_bad_cluster_environment_says_what_is_wrong(env: dict[str, str], text: str) -> None:
    with pytest.raises(ClusterConfigError, match=text.replace("(", r"\(")):
        tf_config(env)


def writer(payload: bytes) -> Any:
    """A stand-in for tf.train.Checkpoint.write: the two files it writes at ``prefix``."""

    def write(prefix: str) -> str:
        Path(prefix + ".index").write_bytes(b"index" + payload)
        Path(prefix + ".data-00000-of-00001").write_bytes(payload * 100)
        return prefix

    return write


def store(root: Path, job: str = "a", chief: bool = True, keep: int = 2) -> TfCheckpoints:
    return TfCheckpoints(str(root), every_steps=10, keep=keep, identity={"job": job},
                         chief=chief, log=lambda m: print(m, file=sys.stderr))  # fmt: skip


def save(s: TfCheckpoints, step: int, payload: bytes, world: int = 1) -> Path:
    """What every worker does at a save, here the chief alone: a new directory, written."""
    path = s.new_dir(step)
    s.write(path, step, writer(payload), world_size=world)
    return path


def test_saves_are_marked_complete_verified_and_kept_to_keep(tmp_path: Path) -> None:
    s = store(tmp_path)
    for step in (10, 20, 30):
        path = save(s, step, str(step).encode(), world=2)
        marker = json.loads((path / integrity.MARKER).read_text())
        assert marker["step"] == step and marker["world_size"] == 2
        assert set(marker["files"]) == {f"{PREFIX}.index", f"{PREFIX}.data-00000-of-00001"}
    assert [step for step, _, ok in s.dirs() if ok] == [20, 30]  # keep 2
    assert s.newest_usable(2) == path
    # A torn save (no marker) is never chosen; a worker that is not the chief writes only a
    # temporary copy, never into the step directory.
    torn = tmp_path / "step_000000040-abcdef"
    torn.mkdir()
    assert s.newest_usable(2) == path
    store(tmp_path, chief=False).write(torn, 40, writer(b"x"), world_size=2)
    assert list(torn.iterdir()) == []
    # Another number of workers: their global batch, refused with both counts.
    with pytest.raises(CheckpointMismatchError, match="written by 2 workers, this job has 3"):
        s.newest_usable(3)


@pytest.mark.parametrize("step", [0, 1, 50, 2**24 + 1, 999_999_999])
def test_the_chiefs_verdict_survives_the_float32_sum(step: int) -> None:
    """The directory name travels as float32 numbers the other workers add zeros to: exact for
    every step a step directory's name holds (9 digits) and every 6-hex suffix."""
    import numpy as np

    name = f"step_{step:09d}-fe01a9"
    values = np.asarray(ckpt.encode(ckpt.FOUND, name), dtype=np.float32)
    summed = values + np.zeros_like(values) + np.zeros_like(values)  # three workers
    assert ckpt.decode([int(v) for v in summed]) == (ckpt.FOUND, name)
    none = np.asarray(ckpt.encode(ckpt.NONE, None), dtype=np.float32)
    assert ckpt.decode([int(v) for v in none]) == (ckpt.NONE, None)
    assert ckpt.decode([int(v) for v in ckpt.encode(ckpt.REFUSED, None)])[0] == ckpt.REFUSED


def test_a_corrupt_checkpoint_is_set_aside_and_the_previous_one_used(tmp_path: Path) -> None:
    s = store(tmp_path)
    older = save(s, 10, b"ten")
    newest = save(s, 20, b"twenty")
    data = newest / f"{PREFIX}.data-00000-of-00001"
    data.write_bytes(b"X" + data.read_bytes()[1:])  # one byte flipped, same size
    assert s.newest_usable(1) == older
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").is_dir()
    (older / f"{PREFIX}.index").write_bytes(b"cut")
    with pytest.raises(NoUsableCheckpointError, match="every complete one is corrupt"):
        s.newest_usable(1)


def test_another_jobs_or_models_checkpoint_is_refused_and_never_purged(tmp_path: Path) -> None:
    save(store(tmp_path, job="other"), 10, b"theirs")
    mine = store(tmp_path, job="mine", keep=1)
    with pytest.raises(CheckpointMismatchError, match="belongs to job other, not mine"):
        mine.newest_usable(1)
    save(mine, 20, b"a")
    save(mine, 30, b"b")
    owners = [integrity.owner(mine._fs, str(p)) for _, p, _ in mine.dirs()]
    assert owners == ["other", "mine"]
    # The same job name, another model (a PyTorch job's checkpoints, say): refused.
    torch_like = TfCheckpoints(str(tmp_path / "m"), every_steps=10, keep=2, chief=True,
                               identity={"job": "j", "model": "aaaa"}, log=print)  # fmt: skip
    save(torch_like, 10, b"t")
    tf_like = TfCheckpoints(str(tmp_path / "m"), every_steps=10, keep=2, chief=True,
                            identity={"job": "j", "model": "bbbb"}, log=print)  # fmt: skip
    with pytest.raises(CheckpointMismatchError, match="written by another model"):
        tf_like.newest_usable(1)


def test_every_framework_has_its_targets_and_a_worker() -> None:
    assert set(FRAMEWORK_TARGETS) == set(FRAMEWORKS)
    # a worker for the built-in workloads of each framework that has any (Horovod runs scripts)
    assert set(FRAMEWORK_MODULES) == {f for f, names in FRAMEWORK_WORKLOADS.items() if names}
    assert all(TARGETS.keys() >= set(targets) for targets in FRAMEWORK_TARGETS.values())
