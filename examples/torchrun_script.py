"""A plain torchrun script: no gpufleet imports. Runs unchanged under `torchrun` and `gpufleet run`.

torchrun --nproc-per-node 2 examples/torchrun_script.py --steps 20 --out /tmp/a.json
gpufleet run examples/script-job.yaml
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="torchrun_script_result.json")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps):
        x = torch.randn(8, 16, generator=g)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    h = hashlib.sha256()
    for name, p in sorted(model.module.state_dict().items()):
        h.update(name.encode() + p.detach().numpy().tobytes())
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump(
                {"digest": h.hexdigest(), "loss": loss.item(), "world": world, "env": env}, fh
            )
    print(f"rank {rank}/{world} done, loss {loss.item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
