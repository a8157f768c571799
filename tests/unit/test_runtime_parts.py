"""Small runtime parts: sampler resume, digest, RNG capture, fault syntax, context env."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import gpufleet
from gpufleet.errors import NonFiniteError
from gpufleet.runtime import (
    CheckpointSettings,
    JobContext,
    ResumableDistributedSampler,
    RunDir,
    state_digest,
)
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.faults import Fault, parse_faults
from gpufleet.runtime.nonfinite import NonFinitePolicy
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


def test_a_lost_device_raises_what_pytorch_raises_for_one() -> None:
    """What c10's CUDA check raises: torch.AcceleratorError (a RuntimeError) with the CUDA
    error code, cudaErrorLaunchFailure, and its message."""
    import torch

    from gpufleet.runtime.faults import lost_device

    error = lost_device()
    assert isinstance(error, torch.AcceleratorError) and isinstance(error, RuntimeError)
    assert error.error_code == 719  # type: ignore[attr-defined]
    assert str(error).startswith("CUDA error: unspecified launch failure")


def test_parse_faults() -> None:
    assert parse_faults("kill@step=7,rank=1; hang@checkpoint_written=10,restart=1") == [
        Fault("kill", "step", 7, 1, 0),
        Fault("hang", "checkpoint_written", 10, 0, 1),
    ]
    assert parse_faults("slow@calibrate=1,rank=1") == [Fault("slow", "calibrate", 1, 1, 0)]
    assert parse_faults("device@step=25,rank=1") == [Fault("device", "step", 25, 1, 0)]
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


def test_after_an_agreed_stop_a_late_sigterm_cannot_kill_the_rank_before_its_marker() -> None:
    """A rank stops because another rank's node was signalled; its own node's SIGTERM arrives
    while it writes its preemption marker: ignored (the process exits 75 next), where the
    default action killed it and its pod exited 143."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    guard = PreemptionGuard().install()
    try:
        guard.request()  # as the agreement does for a rank that got no signal itself
        assert guard.should_stop()
        guard.uninstall()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    stays = PreemptionGuard().install()
    stays.uninstall()  # no stop agreed: the handlers are restored
    assert signal.getsignal(signal.SIGTERM) is previous


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
    from gpufleet.workloads.synthetic import synthetic_dataset, synthetic_mlp

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


CPU = torch.device("cpu")
NAN = torch.tensor(float("nan"))


def _verdict(policy: NonFinitePolicy, step: int, **kw: Any) -> NonFiniteError:
    with pytest.raises(NonFiniteError) as info:
        policy.check(step, params=kw.get("params"), last_checkpoint=kw.get("last_checkpoint"))
    return info.value


def test_nonfinite_policy_fail_names_the_first_bad_step_and_the_kept_checkpoint() -> None:
    policy = NonFinitePolicy(on_non_finite="fail", device=CPU, world_size=1)
    policy.record(3, torch.tensor(0.5))
    policy.check(3, params=None, last_checkpoint=None)  # finite: nothing to say
    policy.record(4, NAN)
    policy.record(5, torch.tensor(float("inf")))
    exc = _verdict(policy, 5, last_checkpoint="ck/step_4")
    assert exc.step == 4
    assert "at step 4 on rank 0 (checked at step 5)" in str(exc)
    assert "the last good checkpoint, ck/step_4, is kept" in str(exc)
    with pytest.raises(NonFiniteError) as again:
        policy.allow_rollback(exc)  # "fail": no rollback, the same error
    assert again.value is exc


def test_nonfinite_policy_checks_weights_only_when_given_them() -> None:
    policy = NonFinitePolicy(on_non_finite="fail", device=CPU, world_size=1)
    poisoned = [torch.tensor([1.0, float("nan")])]
    policy.check(6, params=None, last_checkpoint=None)  # a log step: the loss only
    policy.check(6, params=[torch.ones(2)], last_checkpoint=None)
    exc = _verdict(policy, 6, params=poisoned)  # a save step: weights too
    assert exc.step == 6 and "no checkpoint was written" in str(exc)


def test_nonfinite_rollback_skips_bad_batches_and_gives_up_after_its_limit(tmp_path: Path) -> None:
    policy = NonFinitePolicy(on_non_finite="rollback", device=CPU, world_size=1, max_rollbacks=2)
    ckpt = Checkpointer(str(tmp_path))
    policy.record(2, NAN)
    early = _verdict(policy, 2)
    with pytest.raises(NonFiniteError, match="no checkpoint to roll back to"):
        policy.roll_back(early, ckpt, lambda ref: None, lambda msg: None)
    policy.first_bad.zero_()
    ckpt.save(3, {"w": torch.ones(2)})
    loaded: list[int] = []
    said: list[str] = []
    for bad in (4, 9):
        policy.record(bad, NAN)
        ref = policy.roll_back(_verdict(policy, bad), ckpt, lambda r: loaded.append(r.step),
                               said.append)  # fmt: skip
        assert ref.step == 3 and policy.skips(bad)
        policy.check(bad, params=None, last_checkpoint=None)  # cleared by the rollback
    assert loaded == [3, 3] and policy.rollbacks == 2 and not policy.skips(5)
    assert "skipping the batch of step 9 (rollback 2 of at most 2)" in said[-1]
    policy.record(12, NAN)
    with pytest.raises(NonFiniteError, match="gave up: rolled back 2 times already, skipping "
                       "the batches of steps 4, 9"):  # fmt: skip
        policy.roll_back(_verdict(policy, 12), ckpt, lambda r: loaded.append(r.step), said.append)
    assert loaded == [3, 3]  # nothing loaded when giving up


def test_run_dir_names_every_file_of_a_run_directory(tmp_path: Path) -> None:
    files = RunDir(tmp_path)
    named = {"result.json": files.result, "progress.json": files.progress,
             "preempted.json": files.preempted, "fatal.json": files.fatal,
             "state.json": files.state, "durable.json": files.durable}  # fmt: skip
    assert all(path == tmp_path / name for name, path in named.items())
    assert files.node_logs(1) == tmp_path / "logs" / "node1"
    assert files.metrics == tmp_path / "metrics"
    assert CheckpointSettings().root(tmp_path) == str(files.checkpoints)
    # A new launch forgets the last one's outcome and uploads, not the count of launches
    # (state.json).
    assert set(files.stale_files()) == {files.result, files.progress, files.preempted, files.fatal,
                                        files.durable}  # fmt: skip


def test_run_directory_file_names_are_written_nowhere_but_rundir() -> None:
    """A module that spells ``"progress.json"`` itself drifts from the one the others read."""
    src = Path(gpufleet.__file__).parent
    names = ("result.json", "progress.json", "preempted.json", "fatal.json", "state.json",
             "durable.json")  # fmt: skip
    # Files of other directories that share a name: a LoadGen report, the dev cluster's state.
    others = {src / "serve" / "loadgen" / "report.py", src / "devcluster" / "state.py"}
    spelled = [
        f"{path.relative_to(src)}: {name}"
        for path in sorted(src.rglob("*.py"))
        if path not in others and path != src / "runtime" / "rundir.py"
        for name in names
        if f'"{name}"' in path.read_text()
    ]
    assert spelled == []


def test_deterministic_cuda_turns_on_the_modes_a_bit_exact_resume_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without them a restarted run on an H200 ended with other weights (test_gpu.py); what the
    GPU run needs is set here the same way, and a user's own cuBLAS workspace is kept."""
    from gpufleet.runtime.distributed import deterministic_cuda

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    try:
        torch.backends.cudnn.benchmark = True
        deterministic_cuda()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        deterministic_cuda()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark = before[1]
