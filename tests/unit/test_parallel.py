"""spec.parallelism in one process: the global-batch sampler, blocks, FSDP2, bf16, activation
checkpointing and gradient accumulation, and exact resume with each (multi-process cases:
tests/chaos/test_resume_world_size.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from gpufleet.errors import EXIT_PREEMPTED, ReshardError
from gpufleet.runtime import CheckpointSettings, JobContext, Trainer, TrainerConfig, seed_everything
from gpufleet.runtime.context import ParallelismSettings
from gpufleet.runtime.data import GlobalBatchSampler
from gpufleet.runtime.distributed import shutdown_distributed
from gpufleet.runtime.files import read_json
from gpufleet.runtime.parallel import default_blocks
from gpufleet.runtime.trainer import cross_entropy_step
from gpufleet.workloads.digits import DigitsCNN
from gpufleet.workloads.synthetic import synthetic_dataset, synthetic_mlp


@pytest.fixture(autouse=True)
def _no_process_group_left() -> Iterator[None]:
    """FSDP makes a one-process group; the next test starts without it."""
    yield
    shutdown_distributed()


def steps_of(
    size: int, global_batch: int, world: int, micro: int, epoch: int, start: int = 0
) -> list[list[int]]:
    """Every step's global batch, rank by rank and micro-batch by micro-batch, as W ranks
    with ``micro`` micro-batches each would train on it."""
    per_rank = []
    for rank in range(world):
        s = GlobalBatchSampler(
            size,
            global_batch=global_batch,
            num_replicas=world,
            rank=rank,
            micro_batches=micro,
            seed=7,
        )
        s.set_position(epoch, start)
        batches = list(s)
        assert len(batches) == len(s)
        assert all(len(b) == global_batch // world // micro for b in batches)
        steps = [batches[i : i + micro] for i in range(0, len(batches), micro)]
        per_rank.append([[i for b in step for i in b] for step in steps])
    return [[i for r in per_rank for i in r[step]] for step in range(len(per_rank[0]))]


@pytest.mark.parametrize(("world", "micro"), [(1, 1), (2, 1), (4, 1), (2, 2), (1, 4)])
def test_a_step_trains_on_the_same_samples_at_every_world_size(world: int, micro: int) -> None:
    for epoch in (0, 1):
        one = steps_of(100, 16, 1, 1, epoch)
        assert steps_of(100, 16, world, micro, epoch) == one
        assert len(one) == 100 // 16  # the partial last global batch is dropped
        flat = [i for step in one for i in step]
        assert len(set(flat)) == len(flat)  # nothing twice in an epoch
    assert steps_of(100, 16, 1, 1, 0) != steps_of(100, 16, 1, 1, 1)  # reshuffled per epoch


def test_a_position_continues_with_the_next_global_batch() -> None:
    whole = steps_of(64, 8, 2, 1, epoch=3)
    assert steps_of(64, 8, 4, 1, epoch=3, start=5) == whole[5:]
    sampler = GlobalBatchSampler(64, global_batch=8, num_replicas=2, rank=1, seed=7)
    sampler.set_position(3, 5)
    first = next(iter(sampler))
    assert sampler.take() == first and sampler.take() == []


@pytest.mark.parametrize(("world", "micro"), [(3, 1), (2, 3), (5, 2)])
def test_the_sampler_refuses_a_global_batch_it_cannot_split(world: int, micro: int) -> None:
    with pytest.raises(ValueError, match=f"does not split into {world} ranks x {micro}"):
        GlobalBatchSampler(100, global_batch=16, num_replicas=world, rank=0, micro_batches=micro)


def test_default_blocks_are_the_layers() -> None:
    cnn = DigitsCNN()
    assert default_blocks(cnn) == [cnn.features, cnn.head]
    mlp = synthetic_mlp(8, 16, 2)
    assert default_blocks(torch.nn.Sequential(mlp, torch.nn.Dropout())) == [mlp[0], mlp[2], mlp[4]]

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Linear(4, 4)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    stack = Stack()
    assert default_blocks(stack) == list(stack.layers)


STEPS = 12


def trainer(
    run_dir: Path,
    settings: ParallelismSettings,
    *,
    stop_at: int | None = None,
    dropout: float = 0.2,
    batch: int = 16,
    lr: float = 1e-2,
) -> Trainer:
    """A small MLP (with dropout: exactness must restore the RNG) on 80 samples: 5 steps per
    epoch at batch 16, so 12 steps cross two epochs."""
    seed_everything(0)
    model = torch.nn.Sequential(synthetic_mlp(8, 16, 2), torch.nn.Dropout(dropout))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    ctx = JobContext(
        name="unit",
        run_dir=run_dir,
        checkpoint=CheckpointSettings(dir=str(run_dir / "ckpt"), every_steps=4),
    )
    calls = {"n": 0}
    made: list[Trainer] = []

    def step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        calls["n"] += 1
        if stop_at is not None and calls["n"] == stop_at * settings.gradient_accumulation:
            made[0].guard.request()  # as a SIGTERM would, in the last micro-batch of a step
        return cross_entropy_step(model, batch)

    cfg = TrainerConfig(steps=STEPS, batch_size=batch, seed=3, log_every=4)
    made.append(
        Trainer(
            model,
            synthetic_dataset(80, 8, seed=1),
            opt,
            config=cfg,
            scheduler=sched,
            context=ctx,
            step_fn=step,
            log=lambda _m: None,
            parallelism=settings,
        )
    )
    return made[0]


FULL = ParallelismSettings(
    strategy="fsdp", mixed_precision="bf16", activation_checkpointing=True, gradient_accumulation=2
)
SETTINGS = [
    pytest.param(ParallelismSettings(), id="ddp"),
    pytest.param(
        ParallelismSettings(
            mixed_precision="bf16", activation_checkpointing=True, gradient_accumulation=2
        ),
        id="ddp-bf16-ac-accum2",
    ),
    pytest.param(ParallelismSettings(strategy="fsdp"), id="fsdp"),
    pytest.param(FULL, id="fsdp-bf16-ac-accum2"),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_preempt_then_resume_is_exact_with_every_setting(
    tmp_path: Path, settings: ParallelismSettings
) -> None:
    straight = trainer(tmp_path / "a", settings).fit()
    assert straight.steps == STEPS and straight.state_digest
    shutdown_distributed()
    with pytest.raises(SystemExit) as info:
        trainer(tmp_path / "b", settings, stop_at=7).fit()
    assert info.value.code == EXIT_PREEMPTED
    # With a process group (FSDP's, even for one process) ranks agree on the stop a step later.
    stopped = read_json(tmp_path / "b" / "preempted.json")["step"]
    assert stopped in (7, 8)
    resumed = trainer(tmp_path / "b", settings).fit()
    assert resumed.resumed_from == stopped
    assert resumed.state_digest == straight.state_digest
    assert resumed.final_loss == straight.final_loss


def test_fsdp_shards_the_parameters_the_optimizer_steps(tmp_path: Path) -> None:
    t = trainer(tmp_path, FULL)
    params = list(t.model.parameters())
    assert params and all(isinstance(p, DTensor) for p in params)
    stepped = [p for group in t.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in stepped] == [id(p) for p in params]
    before = [p.detach().full_tensor().clone() for p in params]
    t.fit()
    assert all(
        not torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, params, strict=True)
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_bf16_computes_in_bf16_and_keeps_fp32_weights(tmp_path: Path, strategy: str) -> None:
    t = trainer(tmp_path, ParallelismSettings(strategy=strategy, mixed_precision="bf16"))
    seen: list[torch.dtype] = []
    first_linear = t.model[0][0]
    first_linear.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    result = t.fit()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # fp32 master weights
    assert result.final_loss is not None


def test_gradient_accumulation_matches_one_batch_of_the_same_size(tmp_path: Path) -> None:
    """Two micro-batches of 8 give one batch of 16's gradient, up to float rounding (no
    dropout: the draws would differ)."""
    one = trainer(tmp_path / "a", ParallelismSettings(), dropout=0.0).fit()
    two = trainer(tmp_path / "b", ParallelismSettings(gradient_accumulation=2), dropout=0.0).fit()
    assert one.final_loss is not None and two.final_loss is not None
    assert two.final_loss == pytest.approx(one.final_loss, rel=1e-5)
    assert one.metrics["global_batch"] == two.metrics["global_batch"] == 16


def test_fsdp_trains_like_ddp(tmp_path: Path) -> None:
    ddp = trainer(tmp_path / "a", ParallelismSettings(), dropout=0.0).fit()
    fsdp = trainer(tmp_path / "b", ParallelismSettings(strategy="fsdp"), dropout=0.0).fit()
    assert fsdp.final_loss == pytest.approx(ddp.final_loss, rel=1e-5)
    assert fsdp.metrics["parameter_bytes"] == ddp.metrics["parameter_bytes"]  # one rank: all


def test_a_global_batch_this_world_cannot_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        trainer(tmp_path, ParallelismSettings(), stop_at=5).fit()  # global batch 16
    before = sorted((tmp_path / "ckpt").iterdir())
    resumed = trainer(tmp_path, ParallelismSettings(gradient_accumulation=3), batch=15)
    with pytest.raises(
        ReshardError,
        match=r"step 5 \(written by 1 worker\) trains with a "
        r"global batch of 16 samples per step, which 1 worker x 3 micro-batches "
        r"cannot split evenly: no world size can with 3 micro-batches: set "
        r"spec.parallelism.gradientAccumulation to a divisor of 16$",
    ) as info:
        resumed.fit()
    assert info.value.exit_code == 2 and info.value.fatal
    assert sorted((tmp_path / "ckpt").iterdir()) == before  # nothing written


def test_a_checkpoint_from_before_the_global_batch_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints written before progress kept the global batch and the shards (no such
    keys) still load: the position reads as steps of batch_size x their world size."""
    from gpufleet.runtime.checkpoint import Checkpointer
    from gpufleet.runtime.trainer import _JobState

    straight = trainer(tmp_path / "a", ParallelismSettings()).fit()
    new_format = _JobState.state_dict

    def old_format(self: _JobState) -> dict[str, Any]:
        state = new_format(self)
        del state["progress"]["global_batch"], state["progress"]["shards"]
        return state

    monkeypatch.setattr(_JobState, "state_dict", old_format)
    with pytest.raises(SystemExit):
        trainer(tmp_path / "b", ParallelismSettings(), stop_at=5).fit()
    monkeypatch.undo()
    ckpts = Checkpointer(str(tmp_path / "b" / "ckpt"), log=lambda _m: None)
    (ref,) = [r for r in ckpts.complete() if r.step == 5]
    assert not ckpts.has_key(ref, "job.progress.global_batch")
    assert not ckpts.has_key(ref, "job.progress.shards")
    resumed = trainer(tmp_path / "b", ParallelismSettings()).fit()
    assert resumed.resumed_from == 5 and resumed.metrics["global_batch"] == 16
    assert resumed.state_digest == straight.state_digest
