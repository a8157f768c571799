"""How the Trainer spreads a model over its workers: DDP or FSDP2, bf16, activation
checkpointing per block, gradient accumulation (spec.parallelism, docs/parallelism.md).

Every part is PyTorch's own: ``DistributedDataParallel``, FSDP2's ``fully_shard`` with a
``MixedPrecisionPolicy``, ``torch.autocast`` and the composable ``checkpoint`` (non-reentrant
activation checkpointing that keeps parameter names, so checkpoints load either way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from gpufleet import torchapi
from gpufleet.errors import JobConfigError
from gpufleet.runtime.context import ParallelismSettings
from gpufleet.runtime.distributed import DistInfo, ensure_process_group
from gpufleet.runtime.exact import ExactReducer, exact_step


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one and activation checkpointing recomputes one by one:
    the entries of the model's longest ``nn.ModuleList`` (a transformer's layers), else its
    children that hold parameters (a ``Sequential``'s layers, a CNN's feature and head
    stacks), looking through a wrapper with a single such child."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if lists:
        return [b for b in max(lists, key=len) if _has_params(b)]
    module = model
    while True:
        children = [c for c in module.children() if _has_params(c)]
        if len(children) != 1:
            return children
        module = children[0]


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


@dataclass
class Parallel:
    """A model made parallel: ``module`` is what the step function calls (the DDP wrapper, or
    the model itself sharded in place by FSDP2); ``exact``: the order-fixed reduction of
    settings.exact_shards (DDP's communication hook when there are several workers)."""

    module: nn.Module
    settings: ParallelismSettings
    device: torch.device
    exact: ExactReducer | None = None

    @property
    def fsdp(self) -> bool:
        """True when the parameters are FSDP2 shards (DTensors)."""
        return self.settings.strategy == "fsdp"

    def compute(self) -> contextlib.AbstractContextManager[Any]:
        """Where forward and loss run: DDP with bf16 autocasts (fp32 master weights, so DDP
        reduces fp32 gradients); FSDP2 casts by its own policy, nothing to add."""
        if self.settings.mixed_precision == "bf16" and not self.fsdp:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """One micro-batch's forward and backward: gradients are reduced across workers only
        on the last of a step (earlier ones accumulate locally)."""
        if self.fsdp:
            self.module.set_requires_gradient_sync(last)  # type: ignore[operator]
            yield
        elif not last and isinstance(self.module, DistributedDataParallel):
            with self.module.no_sync():
                yield
        else:
            yield

    def gradients(
        self,
        batches: list[Any],
        loss_of: Callable[[Any, bool], torch.Tensor],
        *,
        seed: int,
        step: int,
    ) -> torch.Tensor:
        """Forward and backward of this rank's micro-batches of ``step`` (``loss_of(batch,
        last)``), leaving each parameter's gradient of the whole step; returns the mean loss.
        In exact mode the micro-batches are the rank's shards (gpufleet.runtime.exact)."""
        if self.exact is not None:
            return exact_step(self.exact, batches, seed=seed, step=step, loss_of=loss_of,
                              micro_batch=self.micro_batch)  # fmt: skip
        micro, total = len(batches), None
        for i, batch in enumerate(batches):
            with self.micro_batch(last=i == micro - 1):
                loss = loss_of(batch, i == micro - 1)
                # Mean over micro-batches, as one batch of their size would have it.
                (loss / micro if micro > 1 else loss).backward()  # type: ignore[no-untyped-call]
            part = loss.detach() / micro if micro > 1 else loss.detach()
            total = part if total is None else total + part
        assert total is not None  # at least one micro-batch per step
        return total


def make_parallel(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    settings: ParallelismSettings,
    info: DistInfo,
    blocks: list[nn.Module] | None = None,
) -> Parallel:
    """Apply ``settings`` to ``model`` (already on ``info.device``) for training with
    ``optimizer``. FSDP2 swaps every parameter for a sharded one, so the optimizer's parameter
    groups are pointed at the new ones (by name); the optimizer must not have stepped yet."""
    chosen = default_blocks(model) if blocks is None else blocks
    if settings.activation_checkpointing:
        from torch.distributed._composable.checkpoint_activation import checkpoint

        if not chosen:
            raise JobConfigError(
                "activation checkpointing needs blocks: the model has no "
                "child module with parameters"
            )
        for block in chosen:
            checkpoint(block)
    if settings.strategy == "fsdp":
        return Parallel(
            _fully_shard(model, optimizer, settings, info, chosen), settings, info.device
        )
    module: nn.Module = model
    exact = None
    if settings.exact_shards:
        exact = ExactReducer(model, settings.exact_shards, info.world_size, info.rank)
        if info.device.type == "cpu":
            # A CPU matrix product's last bits depend on how many threads split it (measured:
            # 2 threads and 1 differ), so every world size computes a shard on one thread.
            torch.set_num_threads(1)
    if info.world_size > 1:
        ids = [info.local_rank] if info.device.type == "cuda" else None
        module = DistributedDataParallel(model, device_ids=ids)
        if exact is not None:
            exact.register(module)
    return Parallel(module, settings, info.device, exact)


def _fully_shard(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    settings: ParallelismSettings,
    info: DistInfo,
    blocks: list[nn.Module],
) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if optimizer.state:
        raise JobConfigError(
            "FSDP shards the parameters, so the optimizer must be built "
            "before its first step: pass a fresh one to the Trainer"
        )
    ensure_process_group()
    names = {id(p): n for n, p in model.named_parameters()}
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    policy = root = MixedPrecisionPolicy()
    if settings.mixed_precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # The model's output (logits) in fp32, so the loss is computed in fp32; the blocks
        # hand bf16 activations to each other.
        root = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32
        )
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=root)  # the root: what no block holds
    if info.device.type == "cpu":  # Gloo's reduce-scatter (NCCL's averages)
        torchapi.fsdp_gradient_mean([*blocks, model], mesh.get_group())
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(p)]] for p in group["params"]]
    return model


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: an FSDP2 shard's local tensor, else ``t`` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters and of optimizer state (its shard under FSDP)."""
    params = sum(local_tensor(p).numel() * p.element_size() for p in model.parameters())
    optim = 0
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:  # step counters are scalars
                optim += local_tensor(value).numel() * value.element_size()
    return {"parameter": params, "optimizer": optim}


def full_state_digest(model: nn.Module, fsdp: bool) -> str:
    """sha256 of the whole model's weights (gpufleet.runtime.digest's format). With FSDP the
    shards are gathered (a collective: every rank calls it) and rank 0 alone gets the digest;
    the others get ""."""
    from gpufleet.runtime.digest import digest_of, state_digest

    if not fsdp:
        return state_digest(model)
    full: dict[str, Any] = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() != 0:
        return ""
    return digest_of(full)
