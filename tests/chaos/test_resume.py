"""Chaos: kill, hang and corrupt training at many points; the final weights never change.

Each case runs the digits job (2 workers, 40 steps, a checkpoint every 10) with a fault and
compares its ``state_digest`` to an uninterrupted run's (``baseline``): equal means
bit-identical weights. Here: crashes and hangs of a worker, a lost device, torn and corrupt
checkpoints, NaN and its rollback, a full disk. Preemption and kills from outside:
test_resume_preemption.py; another world size and FSDP: test_resume_world_size.py.
The random choices come from GPUFLEET_CHAOS_SEED (tests/support/chaos.py); a failure prints
its seed to replay it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import EXIT_NO_CHECKPOINT, EXIT_NON_FINITE, EXIT_STORAGE
from tests.support.chaos import RNG, SEED, STEPS, rank_logs, straight_run
from tests.support.cli import cli_env, run_cli, summary_of
from tests.support.disk import fill_disk
from tests.support.specs import digits_job, write_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run every chaos case must reproduce."""
    s = straight_run(tmp_path_factory, "baseline", digits_job("straight"))
    assert s["steps"] == STEPS and s["restarts"] == 0 and s["state_digest"]
    return s


KILL_STEP = RNG.randint(1, STEPS - 1)
CASES = [
    pytest.param(f"kill@step={KILL_STEP},rank=1", {}, 1, id=f"sigkill-random-step-{KILL_STEP}"),
    pytest.param("kill@step=10,rank=0", {}, 1, id="sigkill-at-checkpoint-step"),
    pytest.param("kill@checkpoint_written=20,rank=0", {}, 1, id="sigkill-mid-checkpoint-write"),
    pytest.param("exit@step=25,rank=1", {}, 1, id="worker-exit-1"),
    pytest.param("kill@step=12,rank=1;kill@step=27,rank=0,restart=1", {}, 2, id="two-crashes"),
    pytest.param(
        "kill@step=23,rank=1", {"checkpoint": {"everySteps": 10, "async": True}}, 1, id="async-ckpt"
    ),
]


@pytest.mark.parametrize(("faults", "spec", "want_restarts"), CASES)
def test_faults_resume_exactly(
    workdir: Path, baseline: dict[str, Any], faults: str, spec: dict[str, Any], want_restarts: int
) -> None:
    env = cli_env()
    env["GPUFLEET_FAULTS"] = faults
    proc = run_cli("run", str(write_spec(workdir, digits_job("chaos", **spec))), "-o", "json",
                   cwd=workdir, env=env)  # fmt: skip
    logs = rank_logs(workdir, "chaos")
    assert proc.returncode == 0, f"seed {SEED}\n{proc.stderr[-4000:]}"
    s = summary_of(proc)
    assert "gpufleet-fault:" in logs  # the fault really fired
    assert "terminate called" not in logs  # clean teardown, no SIGABRT
    assert s["restarts"] == want_restarts, f"seed {SEED}"
    assert s["steps"] == STEPS
    assert s["state_digest"] == baseline["state_digest"], f"seed {SEED}: weights differ"
    assert s["final_loss"] == baseline["final_loss"]


def test_a_rank_whose_device_is_lost_restarts_and_resumes_exactly(
    workdir: Path, baseline: dict[str, Any]
) -> None:
    """Rank 1's CUDA call raises as on a GPU that fell off the bus (torch.AcceleratorError,
    "unspecified launch failure"): the launcher shows its traceback, rank 1 exits at once
    rather than wait for its peer at the exit barrier (its peer sat in a collective until the
    hang watchdog fired, before the fix), the group restarts once from the last checkpoint and
    ends with the uninterrupted run's weights."""
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "device@step=25,rank=1"
    proc = run_cli("run", str(write_spec(workdir, digits_job("device"))), "-o", "json",
                   cwd=workdir, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = rank_logs(workdir, "device")
    assert "AcceleratorError: CUDA error: unspecified launch failure" in proc.stderr, logs[-3000:]
    assert "rank 0 lost a peer in a collective" in logs
    assert "made no step progress" not in logs + proc.stderr
    assert "resumed from step 20" in logs
    s = summary_of(proc)
    assert s["restarts"] == 1
    assert s["state_digest"] == baseline["state_digest"]


def test_torn_checkpoint_is_skipped(workdir: Path, baseline: dict[str, Any]) -> None:
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "kill@checkpoint_written=20,rank=0"
    proc = run_cli("run", str(write_spec(workdir, digits_job("torn"))), "-o", "json",
                   cwd=workdir, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = rank_logs(workdir, "torn")
    # The step-20 directory was written but never committed: resume comes from step 10.
    assert "resumed from step 10" in logs and "resumed from step 20" not in logs
    assert summary_of(proc)["state_digest"] == baseline["state_digest"]
    ckpts = sorted(p.name for p in (workdir / ".gpufleet/runs/torn/checkpoints").iterdir())
    assert all((workdir / ".gpufleet/runs/torn/checkpoints" / n / "COMPLETE.json").exists()
               for n in ckpts), ckpts  # fmt: skip


def test_hang_detected_within_timeout(workdir: Path, baseline: dict[str, Any]) -> None:
    """Rank 1 hangs at step 15: the watchdog finds it within spec.hangTimeout and dumps its
    stack, the group restarts once and ends with the uninterrupted run's weights (CASES' hang
    case, merged here: one run proves both)."""
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "hang@step=15,rank=1"
    spec = write_spec(workdir, digits_job("hung", hangTimeout="3s"))
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = rank_logs(workdir, "hung")
    assert "rank 1 made no step progress" in logs
    idle = [float(x.split("progress for ")[1].split("s")[0]) for x in logs.splitlines()
            if "made no step progress for" in x]  # fmt: skip
    assert idle and min(idle) < 3.0 + 1.5  # the watchdog polls every 0.15 s here
    assert "in maybe_fire" in logs  # the stack dump shows where rank 1 hung
    assert "terminate called" not in logs  # clean teardown, no SIGABRT
    s = summary_of(proc)
    assert s["restarts"] == 1 and s["steps"] == STEPS, s
    assert s["state_digest"] == baseline["state_digest"]
    assert s["final_loss"] == baseline["final_loss"]


def interrupted_at_35(workdir: Path, name: str) -> tuple[Path, Path]:
    """Run the digits job until a worker fails for good at step 35, after the checkpoints of
    steps 10, 20 and 30; returns the spec to run it again (2 restarts allowed) and the
    checkpoint directory."""
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "exit@step=35,rank=0"
    first = write_spec(workdir, digits_job(name, maxRestarts=0), "first.yaml")
    proc = run_cli("run", str(first), "-o", "json", cwd=workdir, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    ckpts = workdir / ".gpufleet/runs" / name / "checkpoints"
    assert sorted(int(p.name[5:14]) for p in ckpts.iterdir()) == [10, 20, 30]
    return write_spec(workdir, digits_job(name)), ckpts


def flip_newest_shard_bytes(directory: Path) -> Path:
    """Invert 64 bytes in the middle of the largest .distcp shard (bit-rot, a bad copy)."""
    shard = max(directory.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    shard.write_bytes(bytes(data))
    return shard


def test_a_corrupt_newest_checkpoint_falls_back_exactly(
    workdir: Path, baseline: dict[str, Any]
) -> None:
    """The newest checkpoint's shard flipped: the resume sets it aside with a warning naming
    the file, resumes from the one before, and ends with the uninterrupted run's weights (it
    loaded the bad one silently and ended far from them)."""
    spec, ckpts = interrupted_at_35(workdir, "rot")
    newest = max(ckpts.iterdir())
    shard = flip_newest_shard_bytes(newest)
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"checkpoint step 30 is corrupt ({shard.name}: expected sha256" in proc.stderr
    logs = rank_logs(workdir, "rot")
    assert "resumed from step 20" in logs and "resumed from step 30" not in logs
    assert summary_of(proc)["state_digest"] == baseline["state_digest"]
    assert (ckpts / f"{newest.name}.corrupt" / shard.name).is_file()  # set aside, kept


def test_no_usable_checkpoint_exits_4_at_once(workdir: Path) -> None:
    """Every complete checkpoint corrupt: one line and exit 4, no restart, no training from
    step 0 (that is what --fresh is for)."""
    spec, ckpts = interrupted_at_35(workdir, "allrot")
    for step_dir in list(ckpts.iterdir()):
        flip_newest_shard_bytes(step_dir)
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir)
    assert proc.returncode == EXIT_NO_CHECKPOINT, proc.stderr[-3000:]
    s = summary_of(proc)
    assert s["status"] == "Failed" and s["steps"] is None
    assert "no usable checkpoint" in s["message"] and "--fresh" in s["message"]
    assert "\n" not in s["message"]
    assert "Traceback" not in proc.stderr
    logs = rank_logs(workdir, "allrot")
    assert "attempt_1" not in logs  # the group was never restarted
    assert sorted(p.name.endswith(".corrupt") for p in ckpts.iterdir()) == [True] * 3


def test_a_nan_stops_before_it_is_checkpointed_and_the_resume_is_exact(
    workdir: Path, baseline: dict[str, Any]
) -> None:
    """A NaN enters rank 1's weights after step 15: the job stops with exit 5 and one line
    naming the step and rank, before step 20's checkpoint (it trained on and checkpointed NaN,
    rotating the good ones out); no restart is spent on it. Run again, it resumes from step 10
    and ends with the uninterrupted run's weights."""
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "nan@step=15,rank=1"
    spec = write_spec(workdir, digits_job("nan"))
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert proc.returncode == EXIT_NON_FINITE, proc.stderr[-3000:]
    s = summary_of(proc)  # strict JSON: summary_of parses with json.loads
    assert "became NaN or infinite at step 16 on rank 1" in s["message"], s["message"]
    assert "step_000000010" in s["message"] and "\n" not in s["message"]
    assert "Traceback" not in proc.stderr and "attempt_1" not in rank_logs(workdir, "nan")
    ckpts = workdir / ".gpufleet/runs/nan/checkpoints"
    assert [p.name[:14] for p in sorted(ckpts.iterdir())] == ["step_000000010"]
    again = run_cli("run", str(spec), "-o", "json", cwd=workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary_of(again)["state_digest"] == baseline["state_digest"]


ROLLBACK_FAULT = "nan@batch=16,rank=1"  # a bad batch: step 16's loss on rank 1 is NaN


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An otherwise uninterrupted run with onNonFinite rollback over one bad batch."""
    wd = tmp_path_factory.mktemp("rollback")
    env = cli_env()
    env["GPUFLEET_FAULTS"] = ROLLBACK_FAULT
    spec = write_spec(wd, digits_job("rollback", onNonFinite="rollback"))
    proc = run_cli("run", str(spec), "-o", "json", cwd=wd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    # Found at step 20's check, before its checkpoint: back to step 10, batch 16 skipped.
    assert "became NaN or infinite at step 16; rolled back to step 10" in out, out[-3000:]
    assert "skipping the batch of step 16 (rollback 1 of at most 3)" in out
    assert "Traceback" not in proc.stderr
    return summary_of(proc)


def test_rollback_skips_the_bad_batch_and_trains_on(
    rolled_back: dict[str, Any], baseline: dict[str, Any]
) -> None:
    """spec.onNonFinite rollback: the job succeeds, with a finite loss close to the clean
    run's, and weights that are not the clean run's (a batch was skipped: proof that the
    rollback really dropped it rather than, say, retrying it)."""
    assert rolled_back["steps"] == STEPS and rolled_back["restarts"] == 0
    loss, clean = rolled_back["final_loss"], baseline["final_loss"]
    assert loss is not None and abs(loss - clean) < 0.5, (loss, clean)
    assert rolled_back["state_digest"] != baseline["state_digest"]


def test_a_rollback_is_exact_across_crashes(workdir: Path, rolled_back: dict[str, Any]) -> None:
    """Killed at step 18 (the bad batch trained, not yet seen), the restart resumes from step
    10, meets the bad batch again and rolls back; killed again at step 25, the next restart
    resumes from step 20's checkpoint, written after the rollback. The final weights equal the
    uninterrupted rollback run's, bit for bit."""
    env = cli_env()
    env["GPUFLEET_FAULTS"] = (f"{ROLLBACK_FAULT};{ROLLBACK_FAULT},restart=1;"
                              "kill@step=18,rank=0;kill@step=25,rank=1,restart=1")  # fmt: skip
    spec = write_spec(workdir, digits_job("rollback-crash", onNonFinite="rollback"))
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary_of(proc)
    assert s["restarts"] == 2, s
    assert s["state_digest"] == rolled_back["state_digest"]


def test_rollback_gives_up_after_three(workdir: Path) -> None:
    """Four bad batches: three rollbacks, then exit 5 naming the skipped steps, with the last
    good checkpoint (step 10) kept and nothing non-finite committed."""
    env = cli_env()
    env["GPUFLEET_FAULTS"] = ";".join(f"nan@batch={n},rank=0" for n in (12, 13, 14, 17))
    spec = write_spec(workdir, digits_job("giveup", onNonFinite="rollback"))
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir, env=env)
    assert proc.returncode == EXIT_NON_FINITE, proc.stderr[-3000:]
    message = summary_of(proc)["message"]
    assert "at step 17 on rank 0" in message, message
    assert "rolled back 3 times already, skipping the batches of steps 12, 13, 14" in message
    assert "Traceback" not in proc.stderr and "attempt_1" not in rank_logs(workdir, "giveup")
    ckpts = workdir / ".gpufleet/runs/giveup/checkpoints"
    assert [p.name[:14] for p in sorted(ckpts.iterdir())] == ["step_000000010"]


def test_rollback_without_a_checkpoint_fails_clearly(workdir: Path) -> None:
    """lr 1e30 diverges before the first checkpoint: nothing to roll back to, exit 5."""
    doc = digits_job("diverge-rollback", onNonFinite="rollback")
    doc["spec"]["workload"]["lr"] = 1e30
    proc = run_cli("run", str(write_spec(workdir, doc)), "-o", "json", cwd=workdir)
    assert proc.returncode == EXIT_NON_FINITE, proc.stderr[-3000:]
    assert "no checkpoint to roll back to" in summary_of(proc)["message"]


def test_a_diverging_job_exits_5_with_strict_json(workdir: Path) -> None:
    """lr 1e30: NaN from the first steps. Exit 5 at the first check, no checkpoint at all, and
    a summary that is strict JSON (null, never a bare NaN)."""
    doc = digits_job("diverge")
    doc["spec"]["workload"]["lr"] = 1e30
    proc = run_cli("run", str(write_spec(workdir, doc)), "-o", "json", cwd=workdir)
    assert proc.returncode == EXIT_NON_FINITE, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert "NaN" not in line.replace("became NaN", "")
    s = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert "no checkpoint was written" in s["message"]
    assert not any((workdir / ".gpufleet/runs/diverge/checkpoints").glob("step_*"))


@pytest.fixture
def tiny_disk(workdir: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk that fills up."""
    mount = workdir / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"needs mount(2) for a small tmpfs (root or CAP_SYS_ADMIN): {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_ends_in_one_line_and_resumes_exactly_once_freed(
    workdir: Path, baseline: dict[str, Any], tiny_disk: Path
) -> None:
    """The checkpoint disk fills up: the save of step 20 fails with ENOSPC; the job exits 6
    at once (no futile restarts) naming the directory, the error and the free space, the torn
    directory is gone, step 10's checkpoint is intact. Space freed, the run resumes from it
    and ends with the uninterrupted run's weights."""
    ckpt = tiny_disk / "ckpt"
    env = cli_env()
    env["GPUFLEET_FAULTS"] = "exit@step=15,rank=0"
    first = write_spec(workdir, digits_job("full", maxRestarts=0, checkpoint={
        "dir": str(ckpt), "everySteps": 10}), "first.yaml")  # fmt: skip
    assert run_cli("run", str(first), cwd=workdir, env=env).returncode == 1
    assert [p.name[:14] for p in ckpt.glob("step_*")] == ["step_000000010"]
    filler = fill_disk(tiny_disk)
    spec = write_spec(workdir, digits_job("full", checkpoint={"dir": str(ckpt), "everySteps": 10}))
    proc = run_cli("run", str(spec), "-o", "json", cwd=workdir)
    assert proc.returncode == EXIT_STORAGE, proc.stderr[-3000:]
    message = summary_of(proc)["message"]
    assert f"could not be written to {ckpt}: [Errno 28] No space left on device" in message
    assert "MiB free of" in message and "newest: step 10" in message and "\n" not in message
    assert "Traceback" not in proc.stderr and "attempt_1" not in rank_logs(workdir, "full")
    assert [p.name[:14] for p in ckpt.glob("step_*")] == ["step_000000010"]  # no torn dir
    filler.unlink()
    again = run_cli("run", str(spec), "-o", "json", cwd=workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary_of(again)["state_digest"] == baseline["state_digest"]
