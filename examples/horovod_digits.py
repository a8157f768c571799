"""A Horovod PyTorch script in the style of Horovod's own examples (pytorch_mnist.py, with the
checkpoints and resume of pytorch_imagenet_resnet50.py), on scikit-learn's digits: no gpufleet
imports. Runs unchanged under Horovod's launcher, mpirun and gpufleet:

horovodrun -np 2 -H localhost:2 --gloo python examples/horovod_digits.py --checkpoint-dir /tmp/h
gpufleet run examples/horovod-digits.yaml
"""

import argparse
import hashlib
import json
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from sklearn.datasets import load_digits
from torch import nn, optim

parser = argparse.ArgumentParser(description="Horovod PyTorch digits example")
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--lr", type=float, default=0.02, help="per worker, scaled by hvd.size()")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
parser.add_argument("--out", default="horovod_digits_result.json", help="rank 0's result")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def checkpoint_path(args: argparse.Namespace, epoch: int) -> str:
    return os.path.join(args.checkpoint_dir, f"checkpoint-{epoch}.pth.tar")


def save_checkpoint(args, model, optimizer, epoch: int) -> None:  # type: ignore[no-untyped-def]
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        path = checkpoint_path(args, epoch)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, path + ".tmp")  # whole or absent: a crash mid-save is no checkpoint
        os.replace(path + ".tmp", path)


def main() -> None:
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = load_digits(return_X_y=True)
    dataset = torch.utils.data.TensorDataset(
        torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    )
    # Horovod: use DistributedSampler to partition the training data.
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = Net()
    # Horovod: scale learning rate by the number of workers.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # Horovod: the newest checkpoint, found by rank 0 and broadcast, is where all ranks resume.
    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(checkpoint_path(args, try_epoch)):
            resume_from_epoch = try_epoch
            break
    resume_from_epoch = hvd.broadcast(
        torch.tensor(resume_from_epoch), root_rank=0, name="resume_from_epoch"
    ).item()
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(checkpoint_path(args, resume_from_epoch))
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        print(f"resumed from epoch {resume_from_epoch}", flush=True)

    # Horovod: broadcast parameters & optimizer state from rank 0.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    loss = torch.tensor(0.0)
    for epoch in range(resume_from_epoch, args.epochs):
        model.train()
        sampler.set_epoch(epoch)  # Horovod: a different shuffle each epoch, the same on resume
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
        loss = hvd.allreduce(loss.detach(), name="avg_loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.6f}", flush=True)
        save_checkpoint(args, model, optimizer, epoch + 1)

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.numpy().tobytes())
    if hvd.rank() == 0:
        print(f"state digest {digest.hexdigest()}", flush=True)
        with open(args.out, "w") as fh:
            result = {"digest": digest.hexdigest(), "loss": loss.item(), "size": hvd.size(),
                      "resumed_from_epoch": resume_from_epoch}  # fmt: skip
            json.dump(result, fh)


if __name__ == "__main__":
    main()
