"""gpufleet.torchapi: where torch's API differs inside gpufleet's range. Each test holds on every
torch of the range (`make compat TORCH=<version>` runs them at the floor and the newest), taking
the path the installed torch takes; a path that this torch does not take is forced where that
is possible without it (the FSDP2 gradient mean over a summing backend)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.distributed.launcher.api import LaunchConfig

from gpufleet import torchapi

pytestmark = pytest.mark.slow

# Two ranks over Gloo: FSDP2 on an MLP, each rank half of a batch of 16; rank 0 writes the full
# gradients. argv: the output file, and "sum" to take the path of a backend that sums under
# ReduceOp.AVG (torch 2.8's Gloo) whatever this torch's does.
GRADIENTS = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from gpufleet import torchapi

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    if sys.argv[2] == "sum":
        torchapi.averages = lambda group: False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    blocks = [model[0], model[2]]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torchapi.fsdp_gradient_mean([*blocks, model], mesh.get_group())
    torch.manual_seed(1)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    part = slice(rank * 16 // world, (rank + 1) * 16 // world)
    torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(grads, sys.argv[1])
    dist.destroy_process_group()
""")


def gradients(tmp_path: Path, world: int, path: str) -> dict[str, object]:
    import torch

    script, out = tmp_path / "grads.py", tmp_path / f"grads-{world}-{path}.pt"
    script.write_text(GRADIENTS)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(script), str(out), path],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    grads: dict[str, object] = torch.load(out)
    return grads


@pytest.mark.parametrize("path", ["as-this-torch", "sum"])
def test_fsdp_averages_the_gradients_over_gloo(tmp_path: Path, path: str) -> None:
    """Two ranks' FSDP2 gradients equal one rank's over the whole batch: a mean, not a sum."""
    import torch

    one, two = gradients(tmp_path, 1, path), gradients(tmp_path, 2, path)
    assert one.keys() == two.keys()
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=1e-5, atol=1e-7), name  # type: ignore[arg-type]


def test_async_save_commits_through_this_torchs_path(tmp_path: Path) -> None:
    """With a stager (torch 2.9+) the staging is its own future; without one (torch 2.8)
    async_save has copied the state when it returns."""
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_loader import load

    stager = torchapi.new_stager(cuda=False)
    staging = importable("torch.distributed.checkpoint.staging", "DefaultStager")
    assert (stager is None) == (not staging)
    state = {"w": torch.arange(4.0)}
    staged, upload = torchapi.async_save(state, FileSystemWriter(str(tmp_path)), None, stager)
    if staged is not None:
        staged.result()
    state["w"] += 1  # after staging: the checkpoint keeps what was staged
    upload.result()
    back = {"w": torch.zeros(4)}
    load(back, checkpoint_id=str(tmp_path))
    assert torch.equal(back["w"], torch.arange(4.0))
    if stager is not None:
        stager.close()


def test_the_shutdown_timeout_is_given_where_launchconfig_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    has = "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}
    assert torchapi.shutdown_timeout(45.7) == ({"shutdown_timeout": 45} if has else {})
    if has:
        assert torchapi.shutdown_timeout(0.2) == {"shutdown_timeout": 1}
        # What a pod's torchrun reads (the renderers set it; gpufleet.render.podspec)
        monkeypatch.setenv(torchapi.ENV_SHUTDOWN_TIMEOUT, "45")
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1)
        assert config.shutdown_timeout == 45


def importable(module: str, name: str) -> bool:
    try:
        return hasattr(__import__(module, fromlist=[name]), name)
    except ImportError:
        return False
