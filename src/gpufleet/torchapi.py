"""Where torch's API differs inside gpufleet's range (pyproject.toml: torch>=2.8.0a0), one function
per difference, each deciding by what the installed torch has (never by its version string),
so that a team's own torch runs as it is: nothing is patched (`make compat TORCH=<version>`
runs the core of the suite against any release; docs/images.md).

- Async checkpoint staging (torch 2.9+): DCP's DefaultStager copies the state in its own thread,
  and async_save returns the staging and the upload as two futures. Before 2.9, async_save
  copies the state before it returns, and returns the upload's future alone.
- FSDP2's gradient mean over Gloo: FSDP2 reduce-scatters fp32 gradients with ReduceOp.AVG,
  which torch 2.8's Gloo carries out as a sum (a CPU job's gradients were world-size times
  too large, so a resize changed the model). Where a probe finds that, FSDP2 sums and divides
  by itself (its own switch for backends without AVG).
- All-gather and reduce-scatter into single tensors: `all_gather_single` and
  `reduce_scatter_single` from torch 2.13 (the older names warn there), `*_into_tensor` and
  `reduce_scatter_tensor` before.
- DCP's fsspec storage: `torch.distributed.checkpoint.fsspec_filesystem` from torch 2.15 (the
  private `_fsspec_filesystem` warns there that it will be removed), the private one before.
- The agents' shutdown timeout (torch 2.12+): how long torchrun waits for its workers after
  SIGTERM before it kills them (spec.preemption.gracePeriod). Before 2.12 it is 30 s, fixed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

# torchrun's agents read it (torch 2.12+) when no --shutdown-timeout is given: the pod
# renderers set it in the container's env, which an older torchrun ignores (a flag it does not
# know would fail it instead).
ENV_SHUTDOWN_TIMEOUT = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def new_stager(*, cuda: bool) -> Any | None:
    """DCP's stager for async saves (torch 2.9+): CPU staging buffers (pinned with CUDA) that it
    keeps and reuses, copied in its own thread. None before 2.9: async_save stages itself."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:
        return None
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,
            use_async_staging=True,
            use_non_blocking_copy=cuda,
        )
    )


def async_save(
    state: dict[str, Any], writer: Any, group: Any, stager: Any | None
) -> tuple[Future[Any] | None, Future[Any]]:
    """DCP's async_save: (the staging's future, or None once the state is copied; the upload's
    future)."""
    from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

    if stager is None:
        upload: Any = dcp_async_save(state, storage_writer=writer, process_group=group)
        return None, upload
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    result = dcp_async_save(state, storage_writer=writer, process_group=group, async_stager=stager)
    if isinstance(result, AsyncSaveResponse):
        return result.staging_completion, result.upload_completion
    return None, result


def shutdown_timeout(seconds: float, config: type | None = None) -> dict[str, Any]:
    """``config``'s keyword for the agents' shutdown timeout, where it has one (LaunchConfig,
    by default: torch 2.12+); an older torch waits 30 s, fixed."""
    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" not in {f.name for f in dataclasses.fields(config or LaunchConfig)}:
        return {}
    return {"shutdown_timeout": max(1, int(seconds))}


def averages(group: Any) -> bool:
    """Whether ``group``'s reduce-scatter carries out ReduceOp.AVG as a mean (a collective:
    every rank of the group calls it). Torch 2.8's Gloo sums instead."""
    import torch
    import torch.distributed as dist

    _, reduce_scatter = single_tensor_fns(dist)
    out = torch.zeros(1)
    reduce_scatter(out, torch.ones(dist.get_world_size(group)), op=dist.ReduceOp.AVG, group=group)
    return bool(out.item() == 1.0)


def fsdp_gradient_mean(modules: list[Any], group: Any) -> None:
    """Make FSDP2's ``modules`` (each fully_shard-ed) average their gradients over ``group``,
    where its backend would sum them under ReduceOp.AVG (see ``averages``)."""
    import torch.distributed as dist

    if dist.get_world_size(group) == 1 or averages(group):
        return
    for module in modules:
        module.set_force_sum_reduction_for_comms(True)


def single_tensor_fns(dist: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``dist``'s all-gather and reduce-scatter into single tensors, by this torch's names."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return gather, scatter


@functools.cache  # asked at every checkpoint's reader and writer: the failed import once
def fsspec_filesystem() -> Any:
    """DCP's module of FsspecReader and FsspecWriter, by this torch's name for it."""
    import importlib

    try:
        return importlib.import_module("torch.distributed.checkpoint.fsspec_filesystem")
    except ImportError:
        return importlib.import_module("torch.distributed.checkpoint._fsspec_filesystem")
