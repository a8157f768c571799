"""FSDP2's gradients over Gloo are a mean, on every torch of gpufleet's range: torch 2.8's Gloo
carries out FSDP2's ReduceOp.AVG reduce-scatter as a sum, which gpufleet.runtime.parallel's FSDP
set-up finds and corrects (gpufleet.torchapi.fsdp_gradient_mean). Two ranks, each on half of a
batch, must get one rank's gradients of the whole batch. `make compat` runs it at the floor,
where the sum happens; here the correction's own path is also forced ("sum")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import cli_env

pytestmark = pytest.mark.slow

# argv: the output file, and "sum" to take the path of a backend that sums under ReduceOp.AVG
# whatever this torch's Gloo does. Rank 0 writes the full gradients.
GRADIENTS = textwrap.dedent("""
    import sys, torch
    from gpufleet import torchapi
    from gpufleet.runtime.context import ParallelismSettings
    from gpufleet.runtime.distributed import init_distributed
    from gpufleet.runtime.parallel import make_parallel

    info = init_distributed()
    if sys.argv[2] == "sum":
        torchapi.averages = lambda group: False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    parallel = make_parallel(model, optimizer, ParallelismSettings(strategy="fsdp"), info)
    torch.manual_seed(1)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    part = slice(info.rank * 16 // info.world_size, (info.rank + 1) * 16 // info.world_size)
    torch.nn.functional.cross_entropy(parallel.module(x[part]), y[part]).backward()
    grads = {n: p.grad.full_tensor() for n, p in parallel.module.named_parameters()}
    if info.rank == 0:
        torch.save(grads, sys.argv[1])
    torch.distributed.destroy_process_group()
""")


def gradients(tmp_path: Path, world: int, path: str) -> dict[str, Any]:
    import torch

    script, out = tmp_path / "grads.py", tmp_path / f"grads-{world}-{path}.pt"
    script.write_text(GRADIENTS)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(script), str(out), path],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    grads: dict[str, Any] = torch.load(out)
    return grads


@pytest.mark.parametrize("path", ["as-this-torch", "sum"])
def test_fsdp_averages_the_gradients_over_gloo(tmp_path: Path, path: str) -> None:
    """Two ranks' FSDP2 gradients equal one rank's over the whole batch: a mean, not a sum."""
    import torch

    one, two = gradients(tmp_path, 1, path), gradients(tmp_path, 2, path)
    assert one.keys() == two.keys() and one
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=1e-5, atol=1e-7), name
