"""Chaos: exact across world sizes (spec.parallelism.exactAcrossWorldSizes). Uninterrupted runs
at 1, 2 and 4 workers end with one state_digest; a job that crashes, restarts, and resumes at
2 -> 1 -> 2 -> 4 workers ends with it too, sample for sample; with dropout (the digits CNN) as
well. A world size that does not divide the shards is refused before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.runtime.samplelog import read_sample_log
from tests.support.chaos import straight_run
from tests.support.cli import cli_env, run_cli, summary_of
from tests.support.specs import digits_job, write_spec

pytestmark = pytest.mark.slow

STEPS = 24
# AdamW on the synthetic MLP, 4 shards of 8 samples a step: 2 epochs in 24 steps, so the
# resizes fall mid-epoch; a checkpoint every 4 steps.
WORKLOAD = {"name": "synthetic", "steps": STEPS, "batchSize": 16, "logEvery": 4,
            "inputSize": 32, "hiddenSize": 64, "layers": 2, "samples": 400}  # fmt: skip
EXACT = {"exactAcrossWorldSizes": True, "shards": 4}


def exact_job(name: str, procs: int, workload: dict[str, Any] = WORKLOAD, **spec: Any) -> Any:
    batch = workload["batchSize"] * 2 // procs  # the global batch of 2 workers at any size
    return digits_job(name, workload={**workload, "batchSize": batch}, procsPerNode=procs,
                      parallelism=EXACT, checkpoint={"everySteps": 4, "keep": 2},
                      **spec)  # fmt: skip


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Uninterrupted runs by world size (and workload), made on first use."""
    made: dict[tuple[int, str], dict[str, Any]] = {}

    def get(procs: int, workload: dict[str, Any] = WORKLOAD) -> dict[str, Any]:
        key = (procs, workload["name"])
        if key not in made:
            doc = exact_job("straight", procs, workload)
            made[key] = straight_run(tmp_path_factory, f"straight-{procs}-{key[1]}", doc)
        return made[key]

    return get


def test_uninterrupted_runs_at_1_2_and_4_workers_end_with_one_digest(straight: Any) -> None:
    runs = {procs: straight(procs) for procs in (1, 2, 4)}
    assert {r["steps"] for r in runs.values()} == {STEPS}
    assert {r["extra"]["global_batch"] for r in runs.values()} == {32}
    assert len({r["state_digest"] for r in runs.values()}) == 1, runs


def _leg(workdir: Path, spec: Path, procs: int, faults: str, env: dict[str, str],
         *sets: str) -> Any:  # fmt: skip
    """``gpufleet run`` of ``spec`` at ``procs`` workers (a resumed run keeps the checkpoint's
    global batch); ``faults`` in GPUFLEET_FAULTS, ``sets`` more --set overrides."""
    args = [f"spec.procsPerNode={procs}", f"spec.workload.batchSize={32 // procs}", *sets]
    env = {**env, "GPUFLEET_FAULTS": faults} if faults else env
    sets_ = [a for s in args for a in ("--set", s)]
    return run_cli("run", str(spec), *sets_, "-o", "json", cwd=workdir, env=env)


def test_a_job_resized_2_1_2_4_with_restarts_ends_with_the_uninterrupted_digest(
    workdir: Path, straight: Any
) -> None:
    """Each leg fails after a checkpoint (the first after an in-run restart from its step 4
    too), the next resumes at another world size; the last runs to the end."""
    env = {**cli_env(), "GPUFLEET_SAMPLE_LOG": str(workdir / "samples")}
    spec = write_spec(workdir, exact_job("resized", 2, maxRestarts=0))
    first = _leg(workdir, spec, 2, "kill@step=5,rank=1;exit@step=6,rank=0,restart=1", env,
                 "spec.maxRestarts=1")  # fmt: skip
    assert first.returncode == 1 and "restart" in first.stderr, first.stderr[-3000:]
    for procs, faults in [(1, "exit@step=11"), (2, "exit@step=14,rank=1")]:
        failed = _leg(workdir, spec, procs, faults, env)
        assert failed.returncode == 1, failed.stderr[-3000:]
    done = _leg(workdir, spec, 4, "", env)
    assert done.returncode == 0, done.stderr[-3000:]
    s = summary_of(done)
    assert s["resumed_from"] == 12 and s["steps"] == STEPS
    assert "resuming with 4" in done.stderr and "bit for bit" in done.stderr
    assert s["state_digest"] == straight(2)["state_digest"]
    logged = read_sample_log(workdir / "samples")
    assert sorted(logged) == list(range(1, STEPS + 1))
    assert {logged[st].world_size for st in (4, 8, 12, 16)} == {2, 1, 4}


def test_with_dropout_a_resize_ends_with_the_uninterrupted_digest(
    workdir: Path, straight: Any
) -> None:
    """The digits CNN's dropout draws from each shard's seed (step, shard), never the rank's."""
    digits = {"name": "digits", "steps": STEPS, "batchSize": 16, "logEvery": 4}
    spec = write_spec(workdir, exact_job("dropout", 2, digits, maxRestarts=0))
    failed = _leg(workdir, spec, 2, "exit@step=10,rank=1", cli_env())
    assert failed.returncode == 1, failed.stderr[-3000:]
    done = _leg(workdir, spec, 1, "", cli_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary_of(done)["resumed_from"] == 8
    assert summary_of(done)["state_digest"] == straight(1, digits)["state_digest"]
    assert straight(2, digits)["state_digest"] == straight(1, digits)["state_digest"]


def test_a_world_size_that_does_not_divide_the_checkpoints_shards_is_refused(
    workdir: Path,
) -> None:
    """The checkpoint's shards win over the spec's (the cut of its global batch): 4 workers
    cannot continue a job of 2 shards exactly."""
    spec = write_spec(workdir, exact_job("halves", 2, maxRestarts=0))
    two = "spec.parallelism.shards=2"
    assert _leg(workdir, spec, 2, "exit@step=5", cli_env(), two).returncode == 1
    ckpts = workdir / ".gpufleet/runs/halves/checkpoints"
    before = sorted(ckpts.iterdir())
    proc = run_cli("run", str(spec), "--set", "spec.procsPerNode=4", "--set",
                   "spec.workload.batchSize=8", cwd=workdir)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "job halves failed: the checkpoint of step 4 trains exactly across world sizes with 2 "
        "shards per step (spec.parallelism.shards), which 4 workers cannot split evenly: "
        "resume with a world size among 1, 2"
    )
    assert sorted(ckpts.iterdir()) == before
