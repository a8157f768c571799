"""The runtime's smaller parts, each by what it promises: the sample-id log, the job context,
process groups and stores, watchdogs, signals, parallelism refusals and the Trainer's positions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

from gpufleet.errors import EXIT_HUNG, JobConfigError
from gpufleet.net import free_port
from gpufleet.runtime import (
    CheckpointSettings,
    JobContext,
    Trainer,
    TrainerConfig,
    distributed,
    seed_everything,
    watchdog,
)
from gpufleet.runtime.context import ParallelismSettings, cache_dir, env_framework
from gpufleet.runtime.metrics import HUNG_AT, RESUMED_FROM, JobMetrics
from gpufleet.runtime.parallel import Parallel, make_parallel
from gpufleet.runtime.preemption import PreemptionGuard
from gpufleet.runtime.rng import capture_rng, restore_rng
from gpufleet.runtime.samplelog import SampleLog, open_for_rank, read_sample_log
from gpufleet.workloads.synthetic import synthetic_dataset, synthetic_mlp


@pytest.fixture
def no_group() -> Iterator[None]:
    """A test that makes a process group leaves none behind."""
    yield
    distributed.shutdown_distributed()


# ---- the sample-id log -------------------------------------------------------------------
def write_attempt(directory: Path, attempt: int, steps: dict[int, list[list[int]]]) -> None:
    """``steps``: step -> each rank's ids (epoch = step // 10)."""
    world = len(next(iter(steps.values())))
    for rank in range(world):
        log = SampleLog(directory, attempt, rank, world)
        for step, ids in steps.items():
            log.write(step, step // 10, ids[rank])
        log.close()
        log.close()  # twice: a no-op


def test_the_sample_log_keeps_each_steps_latest_attempt_in_rank_order(tmp_path: Path) -> None:
    write_attempt(tmp_path, 100, {1: [[0, 1], [2, 3]], 2: [[4, 5], [6, 7]]})
    write_attempt(tmp_path, 200, {2: [[9], [8], [7]]})  # step 2 again, at world size 3
    (tmp_path / "notes.jsonl").write_text("not a rank's log\n")
    with open(tmp_path / f"{100:020d}-rank0-of-2.jsonl", "a") as fh:
        fh.write("\n")  # a blank line: skipped
    got = read_sample_log(tmp_path)
    assert sorted(got) == [1, 2]
    assert (got[1].epoch, got[1].world_size, got[1].ids) == (0, 2, [0, 1, 2, 3])
    assert (got[2].world_size, got[2].ids) == (3, [9, 8, 7])


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        ({0: [(1, 0, [1])]}, r"attempt 5: step 1 logged by ranks \[0\] of 2"),
        ({0: [(1, 0, [1])], 1: [(1, 1, [2])]}, r"attempt 5: step 1 in epochs \[0, 1\]"),
        ({0: [(1, 0, [1])], 1: [(1, 0, "7")]}, r"not a list of ids: '7'"),
    ],
    ids=["rank-missing", "epochs-disagree", "ids-not-a-list"],
)
def test_a_sample_log_that_cannot_be_trusted_is_refused(
    tmp_path: Path, lines: dict[int, list[tuple[int, int, Any]]], error: str
) -> None:
    for rank, entries in lines.items():
        rows = [json.dumps({"step": s, "epoch": e, "ids": i}) for s, e, i in entries]
        (tmp_path / f"{5:020d}-rank{rank}-of-2.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=error):
        read_sample_log(tmp_path)


def test_a_lone_ranks_log_is_named_by_its_own_attempt(tmp_path: Path) -> None:
    log = open_for_rank(tmp_path / "samples", 0, 1)
    log.write(1, 0, [3, 1])
    log.close()
    (path,) = (tmp_path / "samples").iterdir()
    assert path.name == f"{log.attempt:020d}-rank0-of-1.jsonl" and log.attempt > 0
    assert read_sample_log(tmp_path / "samples")[1].ids == [3, 1]


# ---- the job context ---------------------------------------------------------------------
def test_every_context_field_survives_the_worker_environment(tmp_path: Path) -> None:
    ctx = JobContext(
        name="j",
        run_dir=tmp_path,
        checkpoint=CheckpointSettings(dir="/fast", durable="s3://b/p", durable_keep=9),
        output_hang_timeout=30.0,
        on_non_finite="skip",
        workload={"name": "digits"},
        metrics_dir=str(tmp_path / "prom"),
        parallelism=ParallelismSettings(
            strategy="fsdp", mixed_precision="bf16", gradient_accumulation=2
        ),
        sample_log=tmp_path / "samples",
        framework="ray",
    )
    env = ctx.to_env()
    assert JobContext.from_env(env) == ctx
    assert json.loads(env["GPUFLEET_PARALLELISM"])["gradient_accumulation"] == 2
    assert "GPUFLEET_FRAMEWORK" not in JobContext(name="j").to_env()  # the default: unsaid


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("strategy", "zero3", "strategy must be one of ddp, fsdp, got 'zero3'"),
        ("mixed_precision", "fp16", "mixed_precision must be one of fp32, bf16, got 'fp16'"),
        ("gradient_accumulation", 0, "gradient_accumulation must be >= 1, got 0"),
    ],
)
def test_parallelism_settings_refuse_what_the_trainer_cannot_do(
    field: str, value: object, error: str
) -> None:
    with pytest.raises(ValueError) as caught:
        ParallelismSettings.from_json({field: value})
    assert str(caught.value) == error


def test_the_framework_and_cache_directory_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPUFLEET_FRAMEWORK", raising=False)
    assert env_framework() == "pytorch"
    monkeypatch.setenv("GPUFLEET_FRAMEWORK", "tensorflow")
    assert env_framework() == "tensorflow"
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("GPUFLEET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "gpufleet"


# ---- process groups and the rendezvous store ----------------------------------------------
def test_a_process_group_of_one_is_made_once_and_torn_down_without_peers(no_group: None) -> None:
    distributed.barrier()  # no process group: a no-op that makes none
    assert not dist.is_initialized()
    distributed.ensure_process_group()
    world = dist.group.WORLD
    distributed.ensure_process_group()  # already there: the same group
    assert dist.group.WORLD is world and dist.get_world_size() == 1
    distributed.barrier()  # one rank: returns at once
    distributed.shutdown_distributed(wait_for_peers=False)
    assert not dist.is_initialized() and distributed.control_group() is None


@pytest.mark.parametrize("agent", [True, False], ids=["agent-store", "own-store"])
def test_each_attempt_writes_under_its_own_prefix(
    monkeypatch: pytest.MonkeyPatch, agent: bool
) -> None:
    """Under torchrun's agent store keys carry the run and restart count (a restarted rank
    never reads a dead attempt's addresses); the workers' own store, new per attempt, none."""
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", str(agent))
    timeout = timedelta(seconds=10)
    store_class = dist.TCPStore  # type: ignore[attr-defined]  # exported at runtime
    agents = store_class("127.0.0.1", port, is_master=True, timeout=timeout) if agent else None
    store = distributed._attempt_store(0, 1, timeout)
    store.set("rank0", "addr")
    raw = agents or store_class("127.0.0.1", port, is_master=False, timeout=timeout)
    key = f"gpufleet/r1/attempt_{'3' if agent else 'own'}//rank0"  # PrefixStore adds a "/"
    assert raw.check([key]) and not raw.check(["rank0"])
    assert raw.get(key) == b"addr"


TWO_NODES = """
import json, sys
from pathlib import Path
import torch
from gpufleet.errors import CheckpointError
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.distributed import init_distributed, shutdown_distributed
from gpufleet.runtime.samplelog import open_for_rank
info = init_distributed()
ckpt = Checkpointer(sys.argv[1], identity={"job": "two"})
ckpt.save(5, {f"w{info.rank}": torch.full((4,), float(info.rank))})
attempt = open_for_rank(Path(sys.argv[1]) / "samples", info.rank, info.world_size).attempt
try:
    said = ckpt.latest()
except CheckpointError as exc:
    said = str(exc)
print(json.dumps({"attempt": attempt, "said": said}))
shutdown_distributed()
"""


@pytest.mark.slow
def test_two_nodes_with_their_own_disks_each_keep_the_marker_and_refuse_a_split_resume(
    tmp_path: Path,
) -> None:
    """Two ranks, one per node, each node's fast tier its own disk: each holds its rank's file
    and the same marker; a resume finds no node holding a whole checkpoint and every rank says
    so; the ranks share one sample-log attempt (rank 0's)."""
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", TWO_NODES, str(tmp_path / f"n{r}")],
                              env={**env, "RANK": str(r), "GPUFLEET_NODE_ID": f"node{r}"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    # The script's JSON is its last line: Gloo (torch 2.8) writes its connections to stdout.
    said = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    assert said[0] == said[1] and said[0]["attempt"] > 0
    split = "the fast tier's (step 5) are split over the nodes' own disks"
    assert said[0]["said"].startswith(f"no usable checkpoint in {tmp_path / 'n0'}: {split}")
    (d0,), (d1,) = ((tmp_path / f"n{r}").glob("step_*") for r in (0, 1))
    assert d0.name == d1.name
    assert (d0 / "COMPLETE.json").read_bytes() == (d1 / "COMPLETE.json").read_bytes()
    assert "__0_0.distcp" in os.listdir(d0) and "__1_0.distcp" not in os.listdir(d0)
    assert sorted(os.listdir(d1)) == ["COMPLETE.json", "__1_0.distcp"]  # rank 1's alone
    hosts = {f["host"] for f in json.loads((d0 / "COMPLETE.json").read_text())["files"].values()}
    assert hosts == {"node0", "node1"}


@pytest.mark.gpu
def test_a_gpu_worker_gets_its_local_rank_device_and_its_rng_state_round_trips(
    monkeypatch: pytest.MonkeyPatch, no_group: None
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored after
    monkeypatch.setattr(distributed, "_info", None)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    try:
        info = distributed.init_distributed()
        assert info.device == torch.device("cuda", 0) and info.backend == "nccl"
        state = capture_rng()
        drawn = torch.rand(2, device="cuda")
        restore_rng(state)
        assert torch.equal(torch.rand(2, device="cuda"), drawn)
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark = before[1]


# ---- watchdogs and signals ---------------------------------------------------------------
def test_output_heartbeats_and_a_trainers_steps_are_the_output_watchdogs_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after: watch_output wraps them
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(watchdog, "_output_watchdog", None)
    watchdog.heartbeat()  # no output watchdog yet: a no-op, none is made
    assert watchdog._output_watchdog is None
    out = watchdog.watch_output(0.0, rank=2)  # 0: never fires, the test's process lives on
    assert out._thread is None and out.what == "output or heartbeat"
    out._last = 0.0
    assert print("a line", flush=True) is None and out._last > 0.0  # flush: passed through
    out._last = 0.0
    watchdog.heartbeat()
    assert out._last > 0.0
    watchdog.HangWatchdog(0.0).beat(7)  # a Trainer's watchdog in the same script
    assert out._step == 7


def test_a_stopped_watchdog_ends_its_thread() -> None:
    dog = watchdog.HangWatchdog(600.0).start()
    assert dog._thread is not None and dog._thread.is_alive()
    dog.stop()
    dog._thread.join(10)
    assert not dog._thread.is_alive()


def test_a_silent_worker_is_ended_with_its_stacks_and_the_hang_exit_code() -> None:
    code = ("import time; from gpufleet.runtime.watchdog import HangWatchdog as W; "
            "w = W(0.2, rank=3, on_fire=lambda s: print('last step', s, flush=True)); "
            "w.start(); w.beat(5); time.sleep(60)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == EXIT_HUNG and proc.stdout == "last step 5\n"
    assert "gpufleet: rank 3 made no step progress for " in proc.stderr
    assert "(hangTimeout 0.2s, last step 5); stacks follow" in proc.stderr
    assert proc.stderr.rstrip().endswith('File "<string>", line 1 in <module>')  # main, stuck


def test_a_signal_asks_for_a_stop_once_and_keeps_its_first_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    guard = PreemptionGuard().install()  # tests/conftest.py puts the handlers back
    os.kill(os.getpid(), signal.SIGTERM)
    first = guard.signalled_at
    os.kill(os.getpid(), signal.SIGINT)
    assert guard.requested_locally and first is not None and guard.signalled_at == first
    assert guard.should_stop()
    guard.uninstall()
    err = capsys.readouterr().err
    assert err == "gpufleet: got SIGTERM; checkpointing at the next step boundary\n"


def test_a_guard_installed_off_the_main_thread_leaves_the_handlers_alone() -> None:
    before = signal.getsignal(signal.SIGTERM)
    guard = PreemptionGuard()
    thread = threading.Thread(target=guard.install)
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before and not guard.requested_locally


def test_the_resume_and_hang_gauges_are_made_once_and_follow_the_last_value() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics("m", 1, registry)
    labels = {"job_name": "m", "rank": "1"}
    metrics.record_resume(40)
    metrics.record_resume(60)  # a second resume in the process: the same gauge
    metrics.record_hang(61)
    assert registry.get_sample_value(RESUMED_FROM, labels) == 60.0
    assert registry.get_sample_value(HUNG_AT, labels) == 61.0


# ---- parallelism -------------------------------------------------------------------------
CPU = distributed.DistInfo(0, 0, 1, torch.device("cpu"), "gloo")


def test_activation_checkpointing_without_blocks_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.ReLU())
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    settings = ParallelismSettings(activation_checkpointing=True)
    with pytest.raises(JobConfigError) as caught:
        make_parallel(model, optimizer, settings, CPU)
    assert str(caught.value) == ("activation checkpointing needs blocks: the model has no "
                                 "child module with parameters")  # fmt: skip


def test_fsdp_refuses_an_optimizer_that_has_stepped() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    with pytest.raises(JobConfigError, match="the optimizer must be built before its first"):
        make_parallel(model, optimizer, ParallelismSettings(strategy="fsdp"), CPU)
    assert not dist.is_initialized()  # refused before any process group was made


def test_ddp_reduces_gradients_only_on_a_steps_last_micro_batch(no_group: None) -> None:
    distributed.ensure_process_group()
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    parallel = Parallel(ddp, ParallelismSettings(gradient_accumulation=2), torch.device("cpu"))
    syncs = []
    for last in (False, True):
        with parallel.micro_batch(last):
            syncs.append(ddp.require_backward_grad_sync)
            ddp(torch.ones(1, 2)).sum().backward()
    assert syncs == [False, True]
    assert torch.equal(ddp.module.bias.grad, torch.tensor([2.0]))  # both micro-batches


# ---- the Trainer -------------------------------------------------------------------------
def trained(run_dir: Path, stale_position: bool) -> dict[int, Any]:
    """Four steps of 32 of 100 samples (3 steps an epoch), each step's samples logged."""
    seed_everything(0)
    model = synthetic_mlp(8, 16, 2)
    ctx = JobContext(name="misc", run_dir=run_dir, sample_log=run_dir / "samples",
                     checkpoint=CheckpointSettings(dir=str(run_dir / "ckpt")))  # fmt: skip
    trainer = Trainer(model, synthetic_dataset(100, 8, seed=1),
                      torch.optim.SGD(model.parameters(), lr=0.1),
                      config=TrainerConfig(steps=4, batch_size=32, seed=3, log_every=10),
                      context=ctx, log=lambda _m: None)  # fmt: skip
    assert trainer.module is model  # one process with DDP: nothing to wrap
    if stale_position:  # a position saved at the end of an epoch by an older gpufleet
        trainer.progress.batch_in_epoch = trainer.steps_per_epoch
    assert trainer.fit().steps == 4
    return read_sample_log(run_dir / "samples")


def test_a_position_past_its_epochs_end_starts_the_next_epoch(tmp_path: Path) -> None:
    straight = trained(tmp_path / "a", stale_position=False)
    stale = trained(tmp_path / "b", stale_position=True)
    assert [straight[s].epoch for s in range(1, 5)] == [0, 0, 0, 1]
    assert [stale[s].epoch for s in range(1, 5)] == [1, 1, 1, 2]
    assert stale[1].ids == straight[4].ids  # epoch 1's first global batch
    epoch0 = [i for s in (1, 2, 3) for i in straight[s].ids]
    assert len(epoch0) == len(set(epoch0)) == 96  # no sample twice in an epoch
