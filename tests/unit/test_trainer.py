"""The Trainer in one process: preempt, resume, and the weights match a straight run exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.runtime import CheckpointSettings, JobContext, Trainer, TrainerConfig, seed_everything
from gpufleet.runtime.files import read_json
from gpufleet.runtime.rundir import RunDir
from gpufleet.runtime.trainer import cross_entropy_step
from gpufleet.workloads.synthetic import synthetic_dataset, synthetic_mlp

STEPS = 14


def make_trainer(run_dir: Path, *, stop_at: int | None = None, use_async: bool = False) -> Trainer:
    seed_everything(0)
    model = torch.nn.Sequential(synthetic_mlp(8, 16, 2), torch.nn.Dropout(0.2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ctx = JobContext(
        name="unit",
        run_dir=run_dir,
        checkpoint=CheckpointSettings(
            dir=str(run_dir / "ckpt"), every_steps=4, keep=2, async_save=use_async
        ),
    )
    calls = {"n": 0}
    trainer: Trainer

    def step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        calls["n"] += 1
        if stop_at is not None and calls["n"] == stop_at:
            trainer.guard.request()  # as a SIGTERM would
        return cross_entropy_step(model, batch)

    data = synthetic_dataset(100, 8, seed=1)  # 3 steps per epoch: resume crosses epochs
    cfg = TrainerConfig(steps=STEPS, batch_size=32, seed=3, log_every=5)
    trainer = Trainer(model, data, opt, config=cfg, scheduler=sched, context=ctx, step_fn=step,
                      log=lambda _m: None)  # fmt: skip
    return trainer


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stop_at", [2, 5, 9])
def test_preempt_then_resume_is_exact(tmp_path: Path, stop_at: int, use_async: bool) -> None:
    straight = make_trainer(tmp_path / "a", use_async=use_async).fit()
    assert straight.steps == STEPS and not straight.preempted

    with pytest.raises(SystemExit) as info:
        make_trainer(tmp_path / "b", stop_at=stop_at, use_async=use_async).fit()
    assert info.value.code == EXIT_PREEMPTED
    preempted = read_json(tmp_path / "b" / "preempted.json")
    assert preempted["step"] == stop_at  # one process: stops at the step it was asked to

    resumed = make_trainer(tmp_path / "b", use_async=use_async).fit()
    assert resumed.resumed_from == stop_at
    assert resumed.state_digest == straight.state_digest
    assert resumed.final_loss == straight.final_loss


def test_finished_job_reruns_to_the_same_state(tmp_path: Path) -> None:
    first = make_trainer(tmp_path).fit()
    again = make_trainer(tmp_path).fit()
    assert again.resumed_from == STEPS and again.state_digest == first.state_digest


def test_after_step_sees_every_step_and_ends_training_when_it_says_so(tmp_path: Path) -> None:
    """The hook the time-to-target benchmark stops on: called after each step with its number,
    and True ends the run there (steps, and the result, say so); no hook time in step times."""
    import time

    seen: list[int] = []

    def hook(step: int) -> bool:
        seen.append(step)
        time.sleep(0.3)
        return step == 7

    trainer = make_trainer(tmp_path)
    trainer.after_step = hook
    result = trainer.fit()
    assert seen == list(range(1, 8))
    assert result.steps == 7 and not result.preempted
    assert len(result.step_seconds) == 7
    # Counted, the hook's 0.3 s would be in every step after the first; not counted, a step of
    # this 16-wide MLP is milliseconds, and one of six is enough to tell.
    assert min(result.step_seconds[1:]) < 0.3


def test_the_trainer_saves_when_its_checkpointer_says_so(tmp_path: Path) -> None:
    """The cadence is the Checkpointer's (should_save), not a second copy in the Trainer: a
    Checkpointer told another cadence is obeyed, and the last step is saved as well."""
    trainer = make_trainer(tmp_path)
    assert trainer.checkpointer.every_steps == 4  # the job's spec.checkpoint.everySteps
    trainer.checkpointer.every_steps = 5
    saved: list[int] = []
    trainer.checkpointer.on_commit = lambda step, _seconds, _blocked: saved.append(step)
    trainer.fit()
    assert saved == [5, 10, STEPS]


def test_progress_and_result_land_in_the_run_directory(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    result = trainer.fit()
    trainer.write_result(result)
    files = RunDir(tmp_path)
    progress = read_json(files.progress)
    assert progress["step"] == STEPS and progress["steps"] == STEPS  # the last step reports
    assert read_json(files.result) == result.to_json()
    assert not files.preempted.exists()
