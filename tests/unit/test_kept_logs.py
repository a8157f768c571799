"""The ranks' logs kept beside the checkpoints: copied at a launcher's exit in torchelastic's
layout, read back in time order by the reader pod's command, and the reader pod itself
(restricted, the job's image and checkpoint volume, no GPU, not one of the job's pods)."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from gpufleet.cluster.keptlogs import READER_LABEL, reader_pod
from gpufleet.errors import UserInputError
from gpufleet.kube import job_selector
from gpufleet.launch.keptlogs import MODULE, keep, kept_name, main
from gpufleet.render import TARGETS, check_restricted, render
from gpufleet.runtime import integrity
from gpufleet.spec import validate_training_job
from tests.support.specs import cluster_job


def torchelastic_logs(root: Path, attempts: dict[int, dict[int, str]]) -> Path:
    """A log directory as torchelastic writes it: ``<run>/attempt_<n>/<rank>/stdout.log``."""
    for attempt, ranks in attempts.items():
        for rank, text in ranks.items():
            where = root / "digits_x1y2" / f"attempt_{attempt}" / str(rank)
            where.mkdir(parents=True)
            (where / "stdout.log").write_text(text)
            (where / "stderr.log").write_text(f"warn {attempt}/{rank}\n")
            (where / "error.json").write_text("{}")  # torchelastic's, not a log
    return root


def test_kept_logs_read_back_oldest_pod_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_000000010-abcdef").mkdir(parents=True)
    first = torchelastic_logs(tmp_path / "pod0", {0: {0: "a\nb\n", 1: "c\n"}, 1: {0: "d\n"}})
    later = torchelastic_logs(tmp_path / "pod0b", {0: {0: "e\n"}})
    # the replacement pod's launcher started later; its name sorts after the first's
    assert keep(later, str(ckpt), kept_name(2000.0, "job-0")) is not None
    assert keep(first, str(ckpt), kept_name(1000.0, "job-0")) is not None
    assert main([str(ckpt)]) == 0
    out = capsys.readouterr().out.splitlines()
    t1, t2 = kept_name(1000.0, "job-0"), kept_name(2000.0, "job-0")
    assert out == [
        f"[{t1} attempt 0 rank 0] warn 0/0", f"[{t1} attempt 0 rank 0] a",
        f"[{t1} attempt 0 rank 0] b", f"[{t1} attempt 0 rank 1] warn 0/1",
        f"[{t1} attempt 0 rank 1] c", f"[{t1} attempt 1 rank 0] warn 1/0",
        f"[{t1} attempt 1 rank 0] d", f"[{t2} attempt 0 rank 0] warn 0/0",
        f"[{t2} attempt 0 rank 0] e",
    ]  # fmt: skip
    # the checkpoints are still what they were: logs/ is not a checkpoint, nor removed as one
    survey = integrity.survey(fsspec.filesystem("file"), str(ckpt))
    assert [e.step for e in survey] == [10]
    # --tail: the last lines of each file, a rank's stderr (its traceback) as well as stdout
    assert main(["--tail", "1", str(ckpt)]) == 0
    assert capsys.readouterr().out.splitlines() == [out[0], *out[2:]]


def test_nothing_kept_is_said_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert keep(tmp_path / "no-logs", str(tmp_path), "t-pod") is None
    assert main([str(tmp_path)]) == 1
    assert f"no logs kept in {tmp_path}/logs" in capsys.readouterr().err


def test_a_place_that_cannot_keep_them_is_one_line_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = torchelastic_logs(tmp_path / "pod", {0: {0: "a\n"}})
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a checkpoint "directory" that is a file: even root cannot write
    assert keep(logs, str(blocked), "t-pod") is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"gpufleet: could not keep the ranks' logs in {blocked}/logs/t-pod"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_the_reader_pod_mounts_the_jobs_checkpoints_under_restricted(target: str) -> None:
    volume = {"name": "ckpt", "mountPath": "/ckpt", "claimName": "team-ckpt"}
    job = validate_training_job(
        cluster_job(
            target=target, volumes=[volume], checkpoint={"dir": "/ckpt/x"}, resources={"gpu": 2}
        )
    )
    rendered = next(o for o in render(job, target) if o["kind"] not in ("Service",))
    pod = reader_pod(rendered)
    assert check_restricted(pod["spec"]) == []
    assert reader_pod(rendered, tail=5)["spec"]["containers"][0]["command"][-2:] == ["--tail", "5"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-m", MODULE]
    assert container["image"] == job.spec.image
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUFLEET_CHECKPOINT_DIR"] == "/ckpt/x"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}  # fmt: skip
    assert mounts["ckpt"] == "/ckpt" and claims == {"ckpt": "team-ckpt"}
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] == "ckpt")
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    labels = pod["metadata"]["labels"]
    assert labels[READER_LABEL] == job.metadata.name
    key, value = job_selector(job.metadata.name).split("=")
    assert labels.get(key) != value  # not counted among the job's pods


def test_a_tiered_jobs_fast_tier_may_be_the_pods_own_disk_and_its_logs_go_durable() -> None:
    """With spec.checkpoint.durable and no dir, the fast tier is the pod's run directory (an
    emptyDir: node-local, lost with the pod), so the ranks' logs are kept on the durable tier,
    and the reader pod reads them there."""
    job = validate_training_job(cluster_job(
        checkpoint={"durable": {"dir": "s3://ckpt/train"}}, volumes=[],
        envFrom=[{"secretRef": {"name": "s3"}}]))  # fmt: skip
    rendered = next(o for o in render(job, "job") if o["kind"] == "Job")
    (worker,) = rendered["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["GPUFLEET_CHECKPOINT_DIR"] == "/run/gpufleet/checkpoints"
    assert env["GPUFLEET_CHECKPOINT_DURABLE"] == "s3://ckpt/train"
    run = next(v for v in rendered["spec"]["template"]["spec"]["volumes"] if v["name"] == "run")
    assert "emptyDir" in run
    (reader,) = reader_pod(rendered)["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in reader["env"]}["GPUFLEET_CHECKPOINT_DURABLE"] == (
        "s3://ckpt/train"
    )


def test_a_durable_tier_that_dies_with_the_pod_is_refused() -> None:
    job = validate_training_job(cluster_job(checkpoint={"durable": {"dir": "/scratch/ckpt"}}))
    with pytest.raises(UserInputError) as caught:
        render(job, "job")
    assert "spec.checkpoint.durable.dir" in str(caught.value)
    assert "must outlive the pod" in str(caught.value)
