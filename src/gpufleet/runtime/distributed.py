"""Process-group setup and teardown for workers started by torchrun or gpufleet."""

from __future__ import annotations

import atexit
import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """True on global rank 0, which writes job-level files."""
        return self.rank == 0


_info: DistInfo | None = None
_control_group: dist.ProcessGroup | None = None


def init_distributed(timeout: timedelta = timedelta(minutes=30)) -> DistInfo:
    """Join the job's process group from torchrun's environment (idempotent).

    nccl with one GPU per process when CUDA is present (LOCAL_RANK picks the GPU), gloo on CPU.
    A single process without torchrun variables runs with world size 1 and no process group.
    """
    global _info, _control_group
    if _info is not None:
        return _info
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    # Run on a GPU only: tests/unit/test_runtime_misc.py::test_a_gpu_worker_gets_its_local_rank_*
    if use_cuda:  # pragma: no cover - GPU only
        deterministic_cuda()
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if world > 1 and not dist.is_initialized():
        # "cpu:gloo,cuda:nccl" lets CPU tensors (checkpoint planning, control flags) use gloo.
        pg_backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
        kwargs: dict[str, object] = {}
        if use_cuda:  # pragma: no cover - GPU only: test_gpu.py (several ranks on several GPUs)
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=pg_backend,
            store=_attempt_store(rank, world, timeout),
            rank=rank,
            world_size=world,
            timeout=timeout,
            **kwargs,  # type: ignore[arg-type]
        )
        _control_group = dist.new_group(backend="gloo")
        atexit.register(shutdown_distributed)
    _info = DistInfo(rank, local_rank, world, device, backend)
    return _info


def deterministic_cuda() -> None:
    """Bit-exact resume on GPUs: cuDNN's autotuner and its nondeterministic kernels (conv
    backward, atomics) give a restarted run other weights than an uninterrupted one. PyTorch's
    deterministic mode, and cuBLAS's fixed workspace that mode requires (read when cuBLAS
    starts, so set before the first matrix product; a user's own setting is kept)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def ensure_process_group() -> None:
    """A process group even for one process: FSDP2 shards over a device mesh, which needs one.
    World size 1 gets a private in-memory store (no port, no peer), so a lone worker under
    torchrun and a plain ``python train.py`` both work."""
    if dist.is_initialized():
        return
    info = init_distributed()
    if info.world_size != 1:  # init_distributed made one already; not reached
        return
    backend = "cpu:gloo,cuda:nccl" if info.device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend=backend,
        store=dist.HashStore(),  # type: ignore[attr-defined]  # exported at runtime
        rank=0,
        world_size=1,
    )
    atexit.register(shutdown_distributed)


def _attempt_store(rank: int, world: int, timeout: timedelta) -> Any:
    """The rendezvous store of this restart attempt, with keys no earlier attempt wrote.

    Under torchrun the agent's TCPStore outlives a worker-group restart, and the keys the
    process group writes at init (each rank's gloo/nccl address) are named the same in every
    attempt. A restarted rank can then read its peer's address from the dead attempt and fail
    with "Connection refused" or wait forever (pytorch/pytorch#167288). A prefix per attempt
    keeps attempts apart. A store of the workers' own (pods: gpufleet.launch.pod) is new in
    every attempt and needs none; there the agents' restart counts can differ (a replacement
    pod's agent starts at 0), so a prefix from them would keep the ranks apart instead.
    """
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime, not in stubs
        addr,
        port,
        world_size=None if agent_hosts else world,
        is_master=not agent_hosts and rank == 0,
        timeout=timeout,
        multi_tenant=not agent_hosts,
    )
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if agent_hosts else "own"
    return dist.PrefixStore(  # type: ignore[attr-defined]
        f"gpufleet/{run_id}/attempt_{attempt}/", store
    )


def control_group() -> dist.ProcessGroup | None:
    """A gloo group for small control messages (preemption flags), separate from training."""
    return _control_group


def gather_to_main(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's ``obj`` on rank 0, in rank order (others get []). Collective on ``group``;
    without a process group, ``[obj]``."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out or []


def broadcast_from_main(obj: Any, group: dist.ProcessGroup | None) -> Any:
    """Rank 0's ``obj`` on every rank. Collective on ``group``; without one, ``obj``."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier(group=_control_group)


def shutdown_distributed(wait_for_peers: bool = True) -> None:
    """Tear the process group down so the process exits cleanly (idempotent).

    All ranks meet at a barrier first, so no rank closes its gloo connections while a peer
    still has work in flight on them; a rank that failed (``wait_for_peers`` False) does not:
    its peers wait in a collective it will never join, and would meet it only when the hang
    watchdog ends them; its closed connections end their collective at once instead.

    A rank whose peer vanished mid-operation is the reported cause of "terminate called without
    an active exception" (SIGABRT) at the exit of 2-process gloo jobs; with torch 2.13 we could
    not reproduce it (docs/architecture.md lists what was tried), and the tests check every
    worker log for it.
    """
    global _info, _control_group
    if dist.is_initialized():
        if wait_for_peers:
            with contextlib.suppress(RuntimeError):  # a peer is already gone; destroy anyway
                dist.barrier(group=_control_group)
        dist.destroy_process_group()
    _control_group = None
    _info = None
