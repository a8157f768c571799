"""Exact across world sizes, the parts: the pairwise tree's order, a rank's block as one of its
subtrees, the shard seeds, the one-rank reduction, the spec's rules word for word, the settings'
checks, and what a checkpoint's shards do on load (gpufleet.runtime.exact, spec.training_rules).
The runs at several world sizes are in tests/chaos/test_exact_world_sizes.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from gpufleet.runtime.checkpoint import CheckpointRef
from gpufleet.runtime.context import ParallelismSettings
from gpufleet.runtime.exact import ExactReducer, PairwiseSum, shard_seed, tree_sum
from gpufleet.runtime.resume import Progress, resized_note, unshardable
from gpufleet.spec.training_rules import exact_problems


def test_the_tree_adds_neighbours_first_not_left_to_right() -> None:
    # fp32: 1e8 + 1 rounds to 1e8, so the order decides the result.
    values = [torch.tensor(v, dtype=torch.float32) for v in (1e8, 1.0, -1e8, 1.0)]
    assert tree_sum(values).item() == 0.0  # (1e8 + 1) + (-1e8 + 1)
    assert ((values[0] + values[1]) + values[2] + values[3]).item() == 1.0  # left to right


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_each_ranks_contiguous_block_is_a_subtree(world: int) -> None:
    """What a rank adds alone, then added across ranks in the same tree, is bit for bit the
    sum of all shards at once: the property that makes world sizes agree."""
    gen = torch.Generator().manual_seed(1)
    leaves = [torch.randn(1000, generator=gen) * 10 ** torch.randint(-6, 6, (1000,),
              generator=gen) for _ in range(8)]  # fmt: skip
    per = len(leaves) // world
    partials = [tree_sum(leaves[r * per : (r + 1) * per]) for r in range(world)]
    assert torch.equal(tree_sum(partials), tree_sum(leaves))
    assert not torch.equal(sum(leaves[1:], leaves[0]), tree_sum(leaves))  # order matters here


def test_a_count_that_is_no_power_of_two_has_no_tree() -> None:
    tree = PairwiseSum()
    for value in (1.0, 2.0, 3.0):
        tree.push(torch.tensor(value))
    with pytest.raises(ValueError, match="no power of two"):
        tree.total()


def test_shard_seeds_depend_on_seed_step_and_shard_only() -> None:
    assert shard_seed(0, 3, 1) == shard_seed(0, 3, 1)
    seeds = {shard_seed(s, t, h) for s in (0, 1) for t in (1, 2) for h in (0, 1, 2, 3)}
    assert len(seeds) == 16
    assert all(0 <= s < 2**63 for s in seeds)  # torch.manual_seed's range


def test_one_rank_sets_each_gradient_to_the_trees_mean() -> None:
    model = nn.Linear(3, 2)
    reducer = ExactReducer(model, shards=4, world=1, rank=0)
    reducer.use(4)
    grads = [torch.randn(2, 3, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    for grad in grads:
        model.weight.grad = grad.clone()
        model.bias.grad = None  # no gradient in this shard: counts as zeros
        reducer.keep()
        assert model.weight.grad is None
    reducer.finish_alone()
    assert model.weight.grad is not None and model.bias.grad is not None
    assert torch.equal(model.weight.grad, tree_sum(grads) * 0.25)
    assert torch.equal(model.bias.grad, torch.zeros(2))


def test_a_shards_random_draws_leave_the_ranks_generator_alone() -> None:
    reducer = ExactReducer(nn.Linear(1, 1), shards=4, world=2, rank=1)
    torch.manual_seed(5)
    with reducer.seeded(0, 7, 1):  # rank 1's second shard: shard 3 of step 7
        drawn = torch.rand(3)
    after = torch.rand(1)
    torch.manual_seed(shard_seed(0, 7, 3))
    assert torch.equal(drawn, torch.rand(3))
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_a_world_size_must_divide_the_shards_in_use() -> None:
    reducer = ExactReducer(nn.Linear(1, 1), shards=4, world=4, rank=0)
    with pytest.raises(ValueError, match="4 ranks do not divide 2 shards"):
        reducer.use(2)


# --- settings, spec rules, checkpoint --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exact_shards": 6}, "exact_shards must be a power of two, got 6"),
        ({"exact_shards": -2}, "exact_shards must be a power of two, got -2"),
        ({"exact_shards": 4, "strategy": "fsdp"}, "needs strategy ddp"),
        ({"exact_shards": 4, "gradient_accumulation": 2}, "no gradient_accumulation"),
    ],
)
def test_settings_refuse_what_exact_mode_cannot_do(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ParallelismSettings(**kwargs)


def _spec(parallelism: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"workload": {"name": "synthetic", "batchSize": 16}, "parallelism": parallelism,
            **spec}  # fmt: skip


EXACT = {"exactAcrossWorldSizes": True}


@pytest.mark.parametrize(
    "data",
    [
        _spec(EXACT, procsPerNode=4),
        _spec({**EXACT, "shards": 8}, nodes=2, minNodes=1, procsPerNode=2),
        _spec({"exactAcrossWorldSizes": False}),
        _spec({}),
        _spec({**EXACT, "shards": "many"}),  # its field's own error
    ],
)
def test_exact_rules_leave_a_consistent_spec_alone(data: dict[str, Any]) -> None:
    assert exact_problems(data) == []


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (_spec({"shards": 4}), "shards",
         "applies only with spec.parallelism.exactAcrossWorldSizes: true"),
        (_spec({**EXACT, "strategy": "fsdp"}), "strategy", "is fsdp: exactAcrossWorldSizes "
         "needs ddp (FSDP reduce-scatters in an order the world size decides)"),
        (_spec({**EXACT, "gradientAccumulation": 2}), "gradientAccumulation",
         "must be 1 with exactAcrossWorldSizes: each shard is a micro-batch already"),
        (_spec(EXACT, procsPerNode=3), "shards", "defaults to nodes x procsPerNode (1 x 3) = 3, "
         "not a power of two: set a power of two that every world size of the job divides"),
        (_spec({**EXACT, "shards": 4}, nodes=3, minNodes=1), "shards", "is 4, which a world "
         "size of the job does not divide (3 workers): every node count in minNodes..nodes "
         "times procsPerNode must divide it"),
        (_spec({**EXACT, "shards": 64}, nodes=2), "batchSize", "is 16: 2 workers' global "
         "batch of 32 does not cut into 64 equal shards (spec.parallelism.shards)"),
    ],
)  # fmt: skip
def test_exact_rules_say_what_is_wrong(data: dict[str, Any], path: str, message: str) -> None:
    problems = exact_problems(data)
    assert [(p[-1], m) for p, m in problems] == [(path, message)]


def test_a_checkpoints_shards_win_and_the_mode_follows_the_job() -> None:
    kept = Progress(step=8, global_batch=32, shards=2)
    kept.settle(64, exact_shards=4)
    assert (kept.global_batch, kept.shards) == (32, 2)
    older = Progress(step=8)  # written before the global batch and shards were kept
    older.settle(64, exact_shards=4)
    assert (older.global_batch, older.shards) == (64, 4)
    off = Progress(step=8, global_batch=32, shards=2)
    off.settle(64, exact_shards=0)
    assert off.shards == 0


def test_what_a_resize_in_exact_mode_tells_the_user() -> None:
    ref = CheckpointRef(12, "/ckpt/step_12", world_size=2)
    assert resized_note(ref, 4, Progress(global_batch=32, shards=4)).endswith(
        "the global batch stays 32 (8 per worker) and no sample is skipped or repeated; in 4 "
        "shards per step, summed in a fixed order: weights equal an uninterrupted run's bit "
        "for bit"
    )
    assert unshardable(8, 3, None) == (
        "the checkpoint trains exactly across world sizes with 8 shards per step "
        "(spec.parallelism.shards), which 3 workers cannot split evenly: resume with a world "
        "size among 1, 2, 4, 8"
    )
