"""The launchers' parts that need no worker: --fresh on real checkpoint directories, the job
lock, local secrets, what `gpufleet run` refuses before starting anything, the pod launcher's
metrics, kept logs and exit codes, and the MPI launcher's command line (the run's summary and
the rank logs it quotes: test_launch_summary.py)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousError

from gpufleet.errors import JobLockedError, UserInputError
from gpufleet.launch import keptlogs, local, pod
from gpufleet.launch.fatal import write_fatal
from gpufleet.launch.fresh import set_checkpoints_aside
from gpufleet.launch.lock import job_lock
from gpufleet.launch.secrets import ENV_OBJECTS_DIR, resolve_env
from gpufleet.net import free_port
from gpufleet.runtime import integrity
from gpufleet.runtime.rundir import RunDir
from gpufleet.spec import TrainingJob, validate_training_job
from tests.support.specs import digits_job


def job(**spec: Any) -> TrainingJob:
    return validate_training_job(digits_job("fresh-job", **spec))


def step_dir(root: Path, step: int, owner: str | None) -> Path:
    path = root / f"step_{step:09d}-abc123"
    path.mkdir(parents=True)
    if owner is not None:
        (path / integrity.MARKER).write_text(json.dumps({"identity": {"job": owner}}))
    return path


def test_fresh_moves_this_jobs_and_torn_checkpoints_aside_on_both_tiers(tmp_path: Path) -> None:
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    ours, torn = step_dir(fast, 10, "fresh-job"), step_dir(fast, 20, None)
    theirs, kept_ours = step_dir(fast, 30, "other-job"), step_dir(durable, 10, "fresh-job")
    (fast / "notes").mkdir()
    said: list[str] = []
    tiers = {"dir": f"file://{fast}", "durable": {"dir": str(durable)}}
    set_checkpoints_aside(job(checkpoint=tiers), said.append)
    (fast_archive,) = (fast / ".archive").iterdir()
    assert sorted(p.name for p in fast_archive.iterdir()) == [ours.name, torn.name]
    assert fast_archive.name.startswith("fresh-job-")
    assert theirs.is_dir() and (fast / "notes").is_dir() and not ours.exists()
    (durable_archive,) = (durable / ".archive").iterdir()
    assert [p.name for p in durable_archive.iterdir()] == [kept_ours.name]
    moved = "gpufleet: --fresh moved {} checkpoint(s) of fresh-job to {}"
    assert said == [moved.format(2, fast_archive), moved.format(1, durable_archive)]


def test_fresh_with_nothing_of_its_own_moves_and_says_nothing(tmp_path: Path) -> None:
    step_dir(tmp_path / "ckpt", 10, "other-job")
    said: list[str] = []
    set_checkpoints_aside(job(checkpoint={"dir": str(tmp_path / "ckpt")}), said.append)
    set_checkpoints_aside(job(checkpoint={"dir": str(tmp_path / "none")}), said.append)
    assert said == [] and not (tmp_path / "ckpt" / ".archive").exists()


def test_fresh_refuses_a_remote_directory_with_the_way_around() -> None:
    with pytest.raises(UserInputError) as info:
        set_checkpoints_aside(job(checkpoint={"dir": "s3://team/ckpt"}), print)
    (error,) = info.value.errors
    assert error.path == "spec.checkpoint.dir"
    assert error.message == ("--fresh cannot move checkpoints in s3://team/ckpt aside; delete them "
                             "(e.g. `aws s3 rm --recursive s3://team/ckpt`) or point "
                             "spec.checkpoint.dir somewhere new, then run again")  # fmt: skip


def refused(run_root: Path, name: str, checkpoint_dir: str | None) -> str:
    """The message of the JobLockedError that taking the job's locks raises."""
    with pytest.raises(JobLockedError) as info, job_lock(run_root, name, checkpoint_dir):
        pass
    return str(info.value)


def test_a_second_run_of_a_job_is_refused_and_names_the_holder(tmp_path: Path) -> None:
    ckpt, runs = str(tmp_path / "ckpt"), tmp_path / "runs"
    with job_lock(runs, "a", ckpt):
        holder = rf"\(pid {os.getpid()}, started \d{{4}}-\d\d-\d\d [\d:]{{8}}"
        assert re.match(rf"job a is already running {holder}; lock {runs}/a.lock\): wait for it",
                        refused(runs, "a", None))  # fmt: skip
        other = refused(runs, "b", ckpt)
        assert re.match(rf"job b: checkpoint directory {ckpt} is in use by job a {holder}; lock "
                        rf"{ckpt}/.gpufleet.lock\); give each job its own", other)  # fmt: skip
    with job_lock(runs, "b", ckpt):  # released with its holder
        assert json.loads((tmp_path / "ckpt" / ".gpufleet.lock").read_text())["job"] == "b"


def test_a_lock_whose_holder_has_not_written_it_yet_is_another_jobs(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    fd = os.open(tmp_path / "ckpt" / ".gpufleet.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, still empty
        said = refused(tmp_path / "runs", "b", f"file://{tmp_path}/ckpt")
        assert "in use by job another job (a process that is starting; lock " in said
    finally:
        os.close(fd)
    with job_lock(tmp_path / "runs", "b", "s3://team/ckpt"):  # an object store: not locked
        assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["b.lock"]


@pytest.mark.parametrize(("content", "why"), [(b"\xff\xfe", "'utf-8' codec can't decode"),
                                              (None, "[Errno 21] Is a directory")])  # fmt: skip
def test_an_unreadable_secret_is_a_field_error(tmp_path: Path, content: bytes | None,
                                               why: str) -> None:  # fmt: skip
    key = tmp_path / "secrets" / "hf" / "token"
    key.parent.mkdir(parents=True)
    key.write_bytes(content) if content is not None else key.mkdir()
    ref = {"secretKeyRef": {"name": "hf", "key": "token"}}
    with pytest.raises(UserInputError) as info:
        resolve_env(job(env={"HF_TOKEN": ref}), {ENV_OBJECTS_DIR: str(tmp_path)})
    (error,) = info.value.errors
    assert error.path == str(key) and error.message.startswith(f"cannot read: {why}")


def only_error(info: pytest.ExceptionInfo[UserInputError]) -> tuple[str, str]:
    (error,) = info.value.errors
    return error.path, error.message


def test_run_refuses_a_missing_script_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserInputError) as info:
        local.run_local(job(workload=None, command=["nope.py"]), run_root=tmp_path / "runs")
    where = "workers run the script from the directory `gpufleet run` runs in"
    assert only_error(info) == ("spec.command[0]", f"nope.py: no such file in {tmp_path} ({where})")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("field", ["dir", "durable.dir"])
def test_run_refuses_a_checkpoint_uri_with_no_filesystem(field: str) -> None:
    where = {"dir": "nosuchfs://b/c"} if field == "dir" else {"durable": {"dir": "nosuchfs://b/c"}}
    with pytest.raises(UserInputError) as info:
        local.check_checkpoint_storage(job(checkpoint=where))
    path, message = only_error(info)
    assert path == f"spec.checkpoint.{field}"
    assert message.startswith("no fsspec filesystem for nosuchfs://: ")


def test_run_refuses_a_framework_that_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as if not installed
    with pytest.raises(UserInputError) as info:
        local.check_framework(job(framework="tensorflow", procsPerNode=1))
    assert only_error(info)[1].startswith("spec.framework tensorflow needs: pip install")


def test_run_refuses_a_job_another_run_holds(tmp_path: Path) -> None:
    with job_lock(tmp_path, "fresh-job", None), pytest.raises(JobLockedError):
        local.run_local(job(), run_root=tmp_path)
    assert not (tmp_path / "fresh-job").exists()


def test_each_tensorflow_node_gets_every_workers_address_and_its_index(tmp_path: Path) -> None:
    envs = local.node_envs(job(framework="tensorflow", procsPerNode=1, nodes=2), tmp_path,
                           [7001, 7002, 7003])  # fmt: skip
    assert [(e["GPUFLEET_TF_WORKERS"], e["GPUFLEET_TF_INDEX"]) for e in envs] == [
        ("127.0.0.1:7001,127.0.0.1:7002", "0"), ("127.0.0.1:7001,127.0.0.1:7002", "1")]  # fmt: skip
    (env,) = local.node_envs(job(), tmp_path, [])
    assert "GPUFLEET_TF_WORKERS" not in env and env["GPUFLEET_RUN_DIR"] == str(tmp_path.resolve())


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_the_jobs_metrics_are_served_for_the_run_with_the_uploaders(tmp_path: Path) -> None:
    port = free_port()
    spec = job(metrics={"port": port}, checkpoint={"durable": {"dir": str(tmp_path / "d")}})
    RunDir(tmp_path).durable.write_text(json.dumps({"newest_durable": 20, "failures": 1}))
    with local.serve_metrics(spec, tmp_path):
        text = scrape(port)
    assert 'gpufleet_job_checkpoint_durable_step{job_name="fresh-job"} 20.0' in text
    (RunDir(tmp_path).metrics / "worker_1.db").write_text("")
    with local.serve_metrics(job(), tmp_path):  # no port: nothing served, nothing emptied
        assert (RunDir(tmp_path).metrics / "worker_1.db").exists()


def test_a_metrics_port_in_use_is_a_field_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with (
            pytest.raises(UserInputError) as info,
            local.serve_metrics(job(metrics={"port": port}), tmp_path),
        ):
            pass
    path, message = only_error(info)
    assert path == "spec.metrics.port" and f"cannot listen on http://127.0.0.1:{port}" in message


def failing(exc: BaseException | None) -> Any:
    def run() -> None:
        if exc is not None:
            raise exc

    return run


def rendezvous_error() -> RendezvousError:
    try:
        raise RendezvousError("rendezvous failed") from OSError("connect:\n   refused")
    except RendezvousError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "formed", "preempted", "fatal", "code", "said"),
    [
        (None, False, False, False, 0, ""),
        (rendezvous_error(), True, False, False, 75, "gpufleet: lost the rendezvous host "
         "train-0.train:29400 after the group formed (connect: refused); exit 75: retry, the "
         "job resumes from its last checkpoint\n"),
        (rendezvous_error(), False, False, False, 1,
         "gpufleet: no rendezvous at train-0.train:29400: connect: refused\n"),
        (ChildFailedError("train", {0: ProcessFailure(0, 4242, 1, "/no/error.json")}), False,
         False, False, 1, None),
        (ChildFailedError("train", {0: ProcessFailure(0, 4242, 5, "/no/error.json")}), False,
         False, True, 5, ""),
        (SignalException("got SIGTERM", signal.SIGTERM), True, False, False, 143, ""),
        (SignalException("got SIGTERM", signal.SIGTERM), True, True, False, 75,
         "gpufleet: preempted after a checkpoint\n"),
    ],
)  # fmt: skip
def test_the_pod_launchers_exit_code_for_each_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    exc: BaseException | None, formed: bool, preempted: bool, fatal: bool, code: int,
    said: str | None,
) -> None:  # fmt: skip
    if preempted:
        RunDir(tmp_path).preempted.write_text("{}")
    if fatal:
        write_fatal(tmp_path, 5, "loss is NaN", 0)
    watch = SimpleNamespace(formed=formed)
    args = SimpleNamespace(rdzv_endpoint="train-0.train:29400")
    launch = failing(exc)  # torchrun's outcome, as it raises it
    assert pod._outcome(launch, args, tmp_path, watch) == code  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err == (said if said is not None else f"gpufleet: {exc}\n")


def test_the_pod_serves_its_workers_metrics_only_when_told_where(tmp_path: Path) -> None:
    assert isinstance(pod._metrics({}), nullcontext)
    assert isinstance(pod._metrics({pod.ENV_METRICS_PORT: "9400"}), nullcontext)  # no directory
    RunDir(tmp_path).durable.write_text(json.dumps({"newest_durable": 7}))
    env = {pod.ENV_METRICS_PORT: str(free_port()), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "m"),
           "GPUFLEET_CHECKPOINT_DURABLE": "s3://b/c", "GPUFLEET_RUN_DIR": str(tmp_path),
           "GPUFLEET_JOB_NAME": "train"}  # fmt: skip
    with pod._metrics(env) as port:
        text = scrape(port)
    assert 'gpufleet_job_checkpoint_durable_step{job_name="train"} 7.0' in text


def test_an_object_store_without_the_prefix_has_no_kept_logs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fsspec.implementations.local import LocalFileSystem

    fs = LocalFileSystem(skip_instance_cache=True)

    def no_prefix(path: str) -> Any:  # what some object stores say for a missing prefix
        raise FileNotFoundError(path)

    monkeypatch.setattr(fs, "find", no_prefix)
    assert list(keptlogs.kept_lines(fs, str(tmp_path / "logs"))) == []


def test_reading_kept_logs_needs_a_checkpoint_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("GPUFLEET_CHECKPOINT_DIR", "GPUFLEET_CHECKPOINT_DURABLE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_:
        keptlogs.main([])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.rstrip()
        .endswith("error: no checkpoint directory: give one or set GPUFLEET_CHECKPOINT_DIR")
    )


@pytest.mark.slow
def test_what_is_not_rendered_runs_as_torchrun_would_and_a_given_log_dir_stays_put(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "GPUFLEET_RUN_DIR": str(tmp_path / "run"),
           "GPUFLEET_CHECKPOINT_DIR": str(tmp_path / "ckpt")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.launch.pod", "--standalone", "--nproc-per-node", "1",
         "--log-dir", str(tmp_path / "logs"), "--no-python", "sh", "-c", "echo done"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "gpufleet:" not in done.stderr
    assert done.stdout.splitlines() == ["done"]  # no --tee asked: the worker's output as it is
    assert list((tmp_path / "logs").glob("*/attempt_0")) != []  # torchelastic's own layout
    assert not (tmp_path / "ckpt").exists()  # and none copied beside the checkpoints
