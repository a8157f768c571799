"""The global batch's cut (runtime/data.py's GlobalBatchSampler, runtime/resume.py's loader):
which samples each rank trains on at each step. A wrong cut trains a silently different model
(a sample skipped or seen twice after a resume), so each property is asserted on the indices
themselves; the mutation run of both modules counts on these tests."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from gpufleet.runtime.data import GlobalBatchSampler
from gpufleet.runtime.resume import global_batch_loader


def sampler(size: int = 24, **kw: object) -> GlobalBatchSampler:
    args: dict[str, object] = {"global_batch": 8, "num_replicas": 2, "rank": 0}
    return GlobalBatchSampler(size, **{**args, **kw})  # type: ignore[arg-type]


def test_without_shuffle_the_order_is_the_data_sets() -> None:
    assert sampler(10, shuffle=False).order(0) == list(range(10))
    assert sampler(10, shuffle=False).order(3) == list(range(10))


def test_each_epochs_order_is_torchs_permutation_seeded_with_seed_plus_epoch() -> None:
    # DistributedSampler's seeding: a run resumed from epoch e draws the order it drew first.
    for seed, epoch in [(0, 0), (5, 2), (1, 7)]:
        want = torch.randperm(24, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        assert sampler(seed=seed).order(epoch) == want
    assert sampler(seed=5).order(2) == sampler(seed=2).order(5)


def test_the_seed_is_0_unless_given_as_distributed_samplers_is() -> None:
    plain = GlobalBatchSampler(24, global_batch=8, num_replicas=2, rank=0)
    assert plain.order(1) == torch.randperm(24, generator=torch.Generator().manual_seed(1)).tolist()


def test_a_global_batch_of_one_sample_on_one_rank_is_a_valid_cut() -> None:
    s = GlobalBatchSampler(3, global_batch=1, num_replicas=1, rank=0, shuffle=False)
    assert list(s) == [[0], [1], [2]]


def test_a_fresh_epoch_yields_every_step_of_the_rank_in_order() -> None:
    s = sampler(shuffle=False, rank=1, micro_batches=2)  # 3 steps of 8; rank 1 takes 4..7
    assert list(s) == [[4, 5], [6, 7], [12, 13], [14, 15], [20, 21], [22, 23]]
    assert len(s) == 6


def test_take_returns_every_micro_batch_since_the_last_call_once() -> None:
    s = sampler(shuffle=False, rank=0, micro_batches=2)
    batches = iter(s)
    next(batches), next(batches)  # one step: two micro-batches
    assert s.take() == [0, 1, 2, 3]
    assert s.take() == []
    next(batches)
    assert s.take() == [8, 9]


def test_the_ranks_of_a_step_split_its_global_batch_whatever_the_world() -> None:
    order = sampler(seed=3).order(0)
    for world in (1, 2, 4, 8):
        shares = [next(iter(sampler(num_replicas=world, rank=r, seed=3))) for r in range(world)]
        assert [i for share in shares for i in share] == order[:8]


def data(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def loader(**kw: object) -> tuple[GlobalBatchSampler, object]:
    args: dict[str, object] = {"global_batch": 8, "world": 2, "rank": 0, "micro": 1,
                               "batch_size": 4, "shuffle": True, "seed": 0}  # fmt: skip
    return global_batch_loader(data(32), **{**args, **kw})  # type: ignore[arg-type]


def indices(batches: object) -> list[list[int]]:
    return [batch[0].tolist() for batch in batches]  # type: ignore[attr-defined]


def test_the_loader_keeps_the_order_unshuffled_when_told() -> None:
    _, batches = loader(shuffle=False)
    assert indices(batches) == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19], [24, 25, 26, 27]]


def test_the_loader_shuffles_with_the_seed_it_is_given() -> None:
    _, batches = loader(seed=11)
    order = torch.randperm(32, generator=torch.Generator().manual_seed(11)).tolist()
    assert indices(batches)[0] == order[:4]


def test_the_loader_cuts_each_ranks_share_into_its_micro_batches() -> None:
    _, batches = loader(shuffle=False, micro=2, rank=1)
    assert indices(batches)[:4] == [[4, 5], [6, 7], [12, 13], [14, 15]]


def test_a_step_of_the_loader_claims_exactly_its_samples() -> None:
    # No prefetch: the sampler must not run ahead of the step the sample log records.
    sampler_, batches = loader(shuffle=False)
    first = next(iter(batches))  # type: ignore[call-overload]
    assert sampler_.take() == first[0].tolist() == [0, 1, 2, 3]


def test_iterating_the_loader_leaves_the_global_rng_alone() -> None:
    # A resumed run restores torch's global RNG; the loader must not draw from it.
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    _, batches = loader()
    indices(batches)
    assert torch.equal(torch.get_rng_state(), before)
