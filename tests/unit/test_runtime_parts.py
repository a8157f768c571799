"""Small runtime parts: sampler resume, digest, RNG capture, fault syntax, context env."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from gpufleet.runtime import (
    CheckpointSettings,
    JobContext,
    ResumableDistributedSampler,
    state_digest,
)
from gpufleet.runtime.faults import Fault, parse_faults
from gpufleet.runtime.preemption import PreemptionGuard
from gpufleet.runtime.rng import capture_rng, restore_rng


def test_sampler_resumes_mid_epoch() -> None:
    data = list(range(50))
    whole = ResumableDistributedSampler(data, num_replicas=2, rank=1, seed=3)
    whole.set_epoch(4)
    full = list(whole)
    part = ResumableDistributedSampler(data, num_replicas=2, rank=1, seed=3)
    part.set_epoch(4, start_index=10)
    assert list(part) == full[10:]
    assert len(part) == len(full) - 10


def test_sampler_epochs_differ_and_ranks_disjoint() -> None:
    data = list(range(40))
    a = ResumableDistributedSampler(data, num_replicas=2, rank=0, seed=0)
    b = ResumableDistributedSampler(data, num_replicas=2, rank=1, seed=0)
    a.set_epoch(0)
    b.set_epoch(0)
    assert not set(a) & set(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first


def test_digest_sees_every_bit() -> None:
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    before = state_digest(m)
    assert before == state_digest(m)
    with torch.no_grad():
        m.weight.view(-1)[0] = torch.nextafter(m.weight.view(-1)[0], torch.tensor(10.0))
    assert state_digest(m) != before


def test_rng_round_trip() -> None:
    state = capture_rng()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_parse_faults() -> None:
    assert parse_faults("kill@step=7,rank=1; hang@checkpoint_written=10,restart=1") == [
        Fault("kill", "step", 7, 1, 0),
        Fault("hang", "checkpoint_written", 10, 0, 1),
    ]
    assert parse_faults("slow@calibrate=1,rank=1") == [Fault("slow", "calibrate", 1, 1, 0)]
    for bad in ("boom@step=1", "kill@when=3", "kill@step=x", "kill", "slow@calibration=1"):
        with pytest.raises(ValueError):
            parse_faults(bad)


def test_context_round_trips_through_env(tmp_path: Path) -> None:
    ctx = JobContext(
        name="j",
        run_dir=tmp_path,
        checkpoint=CheckpointSettings(dir="s3://b/p", every_steps=7, keep=2, async_save=True),
        hang_timeout=12.5,
        on_non_finite="rollback",
        workload={"name": "digits", "steps": 3},
    )
    assert JobContext.from_env(ctx.to_env()) == ctx


def test_preemption_guard_without_process_group() -> None:
    guard = PreemptionGuard()
    assert not guard.should_stop()
    guard.request()
    assert guard.should_stop()


def test_errors_gpufleet_raises_on_purpose_share_one_tree() -> None:
    from gpufleet.cluster import ClusterError
    from gpufleet.errors import (
        CheckpointError,
        GpufleetError,
        JobConfigError,
        MetricsPortError,
        UserInputError,
    )

    for cls in (UserInputError, JobConfigError, CheckpointError, MetricsPortError, ClusterError):
        assert issubclass(cls, GpufleetError), cls
    assert issubclass(JobConfigError, ValueError) and issubclass(MetricsPortError, OSError)


def test_a_batch_larger_than_the_data_is_a_job_config_error(tmp_path: Path) -> None:
    from gpufleet.errors import JobConfigError
    from gpufleet.runtime import Trainer, TrainerConfig
    from gpufleet.workloads import synthetic_dataset, synthetic_mlp

    model = synthetic_mlp(8, 16, 2)
    want = r"global batch of 1000 \(1000 per worker\) is larger than the data \(64 samples\)"
    with pytest.raises(JobConfigError, match=want):
        Trainer(
            model,
            synthetic_dataset(64, 8, 2, seed=0),
            torch.optim.SGD(model.parameters(), lr=0.1),
            config=TrainerConfig(steps=1, batch_size=1000),
            context=JobContext(run_dir=tmp_path),
        )
