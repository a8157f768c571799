"""The position a resume starts from, exactly: Progress's epoch rollover, the samplers' defaults
and lengths past the end of an epoch, a batch moved to a device, JobState without a scheduler,
the messages of an unsplittable or resized resume, and the checkpoint fields a non-PyTorch job
is refused (spec.framework)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from gpufleet.runtime.checkpoint import CheckpointRef
from gpufleet.runtime.data import GlobalBatchSampler, ResumableDistributedSampler, to_device
from gpufleet.runtime.distributed import DistInfo
from gpufleet.runtime.resume import JobState, Progress, resized_note, unsplittable
from gpufleet.spec.training_rules import framework_problems

META = torch.device("meta")


def test_progress_starts_a_new_epoch_after_its_last_step() -> None:
    progress = Progress()
    seen = []
    for _ in range(5):
        progress.advance(steps_per_epoch=2)
        seen.append((progress.step, progress.epoch, progress.batch_in_epoch))
    assert seen == [(1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 2, 0), (5, 2, 1)]


# --- ResumableDistributedSampler and GlobalBatchSampler -----------------------------------------


def torch_order(size: int, *, rank: int, **kwargs: Any) -> list[int]:
    """What torch's own DistributedSampler yields for rank ``rank`` of 2 in epoch 0."""
    return list(DistributedSampler(list(range(size)), num_replicas=2, rank=rank, **kwargs))


def test_the_samplers_defaults_are_torchs_with_seed_0_and_drop_last() -> None:
    # 11 samples over 2 ranks: drop_last gives each 5; without it, 6 (one padded).
    sampler = ResumableDistributedSampler(list(range(11)), num_replicas=2, rank=1)
    want = torch_order(11, rank=1, shuffle=True, seed=0, drop_last=True)
    assert len(want) == 5
    assert list(sampler) == want
    assert len(sampler) == 5
    assert sampler.samples_per_epoch() == 5


def test_the_sampler_passes_its_seed_shuffle_and_drop_last_to_torchs() -> None:
    seeded = ResumableDistributedSampler(list(range(40)), num_replicas=2, rank=0, seed=5)
    assert list(seeded) == torch_order(40, rank=0, seed=5)
    assert list(seeded) != torch_order(40, rank=0, seed=0)
    ordered = ResumableDistributedSampler(list(range(9)), num_replicas=2, rank=1, shuffle=False)
    assert list(ordered) == [1, 3, 5, 7]
    padded = ResumableDistributedSampler(
        list(range(9)), num_replicas=2, rank=1, shuffle=False, drop_last=False
    )
    assert list(padded) == [1, 3, 5, 7, 0]


def test_a_new_sampler_stands_at_the_start_of_epoch_0() -> None:
    sampler = ResumableDistributedSampler(list(range(10)), num_replicas=2, rank=0)
    assert (sampler.epoch, sampler.start_index) == (0, 0)
    assert list(sampler) == torch_order(10, rank=0)
    assert len(sampler) == 5


def test_set_epoch_records_the_epoch_and_where_in_it_to_start() -> None:
    sampler = ResumableDistributedSampler(list(range(10)), num_replicas=2, rank=0)
    sampler.set_epoch(3, start_index=2)
    assert (sampler.epoch, sampler.start_index) == (3, 2)


def test_a_sampler_started_past_its_epoch_has_nothing_left() -> None:
    sampler = ResumableDistributedSampler(list(range(10)), num_replicas=2, rank=0)
    sampler.set_epoch(1, start_index=7)
    assert list(sampler) == []
    assert len(sampler) == 0


def test_a_global_batch_sampler_positioned_past_its_epoch_has_nothing_left() -> None:
    sampler = GlobalBatchSampler(64, global_batch=8, num_replicas=2, rank=0, micro_batches=2)
    sampler.set_position(0, sampler.steps_per_epoch + 2)
    assert list(sampler) == []
    assert len(sampler) == 0


# --- to_device --------------------------------------------------------------------------------


def test_to_device_moves_a_tensor_to_the_device_it_is_given() -> None:
    moved = to_device(torch.arange(3), META)
    assert moved.device == META
    assert (moved.shape, moved.dtype) == (torch.Size([3]), torch.int64)


def test_to_device_walks_lists_tuples_and_dicts_and_keeps_their_types() -> None:
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.arange(4)]), "name": "a"}
    moved = to_device(batch, META)
    assert type(moved) is dict and sorted(moved) == ["name", "pair", "x"]
    assert moved["x"].device == META and moved["x"].shape == torch.Size([2])
    pair = moved["pair"]
    assert type(pair) is tuple and len(pair) == 2
    assert pair[0].device == META
    assert type(pair[1]) is list and len(pair[1]) == 1
    assert pair[1][0].device == META and pair[1][0].shape == torch.Size([4])
    assert moved["name"] == "a"


# --- JobState ---------------------------------------------------------------------------------


@dataclass
class Held:
    """What JobState reads from and loads into (the ``Trained`` protocol), without a Trainer."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    progress: Progress = field(default_factory=Progress)
    info: DistInfo = field(default_factory=lambda: DistInfo(0, 0, 1, torch.device("cpu"), "gloo"))


def held(seed: int, lr: float) -> Held:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return Held(model, torch.optim.SGD(model.parameters(), lr=lr))


def job_state(of: Held) -> JobState:
    state = JobState(of)
    state.with_rng = False  # restoring a captured RNG would move the global RNG of other tests
    return state


def test_a_job_without_a_scheduler_saves_an_empty_scheduler_state() -> None:
    saved = job_state(held(0, 0.1)).state_dict()
    assert saved["scheduler"] == {}
    assert saved["progress"] == {"step": 0, "epoch": 0, "batch_in_epoch": 0, "global_batch": 0,
                                 "shards": 0}  # fmt: skip


def test_loading_a_job_state_puts_the_saved_weights_into_the_model() -> None:
    source, target = held(0, 0.5), held(1, 0.1)
    source.progress = Progress(step=7, epoch=1, batch_in_epoch=2, global_batch=16)
    assert not torch.equal(source.model.weight, target.model.weight)
    job_state(target).load_state_dict(job_state(source).state_dict())
    assert isinstance(target.model, torch.nn.Linear) and isinstance(source.model, torch.nn.Linear)
    assert torch.equal(target.model.weight, source.model.weight)
    assert torch.equal(target.model.bias, source.model.bias)
    assert target.optimizer.param_groups[0]["lr"] == 0.5
    assert target.progress == Progress(step=7, epoch=1, batch_in_epoch=2, global_batch=16)


# --- unsplittable and resized_note -------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch", "world", "micro", "ref", "want"),
    [
        pytest.param(
            8, 3, 1, None,
            "the checkpoint of step 0 trains with a global batch of 8 samples per step, which "
            "3 workers x 1 micro-batch cannot split evenly: resume with a world size among "
            "1, 2, 4, 8",
            id="no-checkpoint",
        ),
        pytest.param(
            8, 3, 2, CheckpointRef(40, "/ckpt/step_40"),
            "the checkpoint of step 40 trains with a global batch of 8 samples per step, which "
            "3 workers x 2 micro-batches cannot split evenly: resume with a world size among "
            "1, 2, 4",
            id="writer-unknown",
        ),
        pytest.param(
            12, 5, 1, CheckpointRef(9, "/ckpt/step_9", world_size=1),
            "the checkpoint of step 9 (written by 1 worker) trains with a global batch of 12 "
            "samples per step, which 5 workers x 1 micro-batch cannot split evenly: resume "
            "with a world size among 1, 2, 3, 4, 6, 12",
            id="one-writer",
        ),
        pytest.param(
            10, 1, 3, CheckpointRef(2, "/ckpt/step_2", world_size=2),
            "the checkpoint of step 2 (written by 2 workers) trains with a global batch of 10 "
            "samples per step, which 1 worker x 3 micro-batches cannot split evenly: no world "
            "size can with 3 micro-batches: set spec.parallelism.gradientAccumulation to a "
            "divisor of 10",
            id="no-world-fits",
        ),
    ],
)  # fmt: skip
def test_unsplittable_says_which_world_sizes_would_fit(
    global_batch: int, world: int, micro: int, ref: CheckpointRef | None, want: str
) -> None:
    assert unsplittable(global_batch, world, micro, ref) == want


def test_unsplittable_lists_twelve_world_sizes_in_full() -> None:
    # 60 has exactly 12 divisors: all of them, and no ellipsis.
    assert unsplittable(60, 7, 1, None).endswith(
        "resume with a world size among 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60"
    )


def test_unsplittable_cuts_a_longer_list_after_twelve_world_sizes() -> None:
    # 4096 = 2**12 has 13 divisors: the first 12 are shown, then an ellipsis.
    assert unsplittable(4096, 3, 1, None).endswith(
        "resume with a world size among 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, ..."
    )


def test_resized_note_tells_what_a_resume_at_another_world_size_does() -> None:
    note = resized_note(
        CheckpointRef(30, "/ckpt/step_30", world_size=4), 2, Progress(global_batch=16)
    )
    assert note == (
        "gpufleet: checkpoint written by 4 processes, resuming with 2: model and optimizer "
        "resharded; the global batch stays 16 (8 per worker) and no sample is skipped or "
        "repeated; weights match an uninterrupted run up to reduction order, not bit for bit"
    )


# --- spec.checkpoint of a TensorFlow or Ray job ---------------------------------------------


def test_a_tensorflow_job_may_checkpoint_to_a_file_uri() -> None:
    data = {"framework": "tensorflow", "checkpoint": {"dir": "file:///data/ckpt"}}
    assert framework_problems(data) == []


@pytest.mark.parametrize("framework", ["tensorflow", "ray"])
def test_each_checkpoint_field_a_non_pytorch_job_cannot_have_is_refused_at_its_path(
    framework: str,
) -> None:
    checkpoint = {"dir": "s3://bucket/ckpt", "durable": {"dir": "/mnt/backup"}, "async": True}
    label = f"spec.framework {framework}"
    assert framework_problems({"framework": framework, "checkpoint": checkpoint}) == [
        (
            ("checkpoint", "dir"),
            f"{label} writes checkpoints to a filesystem (a local directory or a mounted "
            "volume), not an object store",
        ),
        (
            ("checkpoint", "durable"),
            f"the durable tier's uploader is gpufleet's PyTorch runtime's; {label} checkpoints "
            "to one place: put it in spec.checkpoint.dir",
        ),
        (
            ("checkpoint", "async"),
            f"asynchronous saves are torch.distributed.checkpoint's; {label} saves synchronously",
        ),
    ]
