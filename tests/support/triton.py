"""gpufleet's model served for tests: a trained digits checkpoint, the digits model exported and
served by real Triton (the shared fixture `served`: tests/integration/test_serving.py,
test_serving_cli.py), and `gpufleet serve` started as users start it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from gpufleet.net import free_port
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.serve.export import export
from gpufleet.serve.repository import Batching
from gpufleet.serve.server import Endpoints, ServeConfig, serving
from gpufleet.workloads.digits import DigitsCNN, digits_datasets
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.oip import MODEL


def trained_checkpoint(root: Path) -> DigitsCNN:
    """A few SGD steps on the digits, saved the way the Trainer saves ({"job": {"model": ...}})."""
    torch.manual_seed(0)
    model = DigitsCNN()
    train, _ = digits_datasets(0)
    x, y = train.tensors
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i in range(30):
        batch = slice(32 * i % len(x), 32 * i % len(x) + 32)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    Checkpointer(str(root), log=lambda _: None).save(30, {"job": {"model": model.state_dict()}})
    return model.eval()


@dataclass
class Served:
    endpoints: Endpoints
    model: DigitsCNN
    images: np.ndarray[Any, Any]
    server: psutil.Process  # tritonserver

    @property
    def host(self) -> str:
        return self.endpoints.http.removeprefix("http://")


@contextmanager
def triton_serving(base: Path) -> Iterator[Served]:
    """The digits model trained, exported and served by Triton from ``base``: the shared
    fixture `served` (tests/integration/conftest.py)."""
    model = trained_checkpoint(base / "run" / "checkpoints")
    entry, _ = export(
        str(base / "run"),
        base / "repo",
        model=MODEL,
        batching=Batching(max_batch_size=64, preferred_batch_sizes=(16, 32, 64)),
    )
    assert entry.directory == base / "repo" / MODEL
    _, test = digits_datasets(0)
    config = ServeConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=base / "triton.log",
    )
    with serving(base / "repo", config) as endpoints:
        server = next(
            p for p in psutil.Process().children(recursive=True) if p.name() == "tritonserver"
        )
        yield Served(endpoints, model, test.tensors[0].numpy(), server)


def start_cli_serve(
    repo: Path, tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.Popen[str], list[str], list[str]]:
    """`gpufleet serve` as users run it, up to its ready line: (process, ports, stderr lines).
    Free ports are picked here and bound by the server later: when another process took one
    in between (the other test worker's), it refuses to start in one line, and is started again
    on other ports (seen once in dashboards_live)."""
    for _ in range(3):
        ports = [str(free_port()) for _ in range(3)]
        proc = subprocess.Popen(
            gpufleet_cmd("serve", "--repository", str(repo), "--http-port", ports[0],
                         "--grpc-port", ports[1], "--metrics-port", ports[2],
                         "--log-file", str(tmp_path / "triton.log"), *args),
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**cli_env(), **env},
        )  # fmt: skip
        assert proc.stderr is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if line.startswith("serving:") or not line:
                break
        if not any("Address already in use" in line for line in lines):
            break
        proc.communicate(timeout=30)
    return proc, ports, lines


@contextmanager
def cli_serve(
    repo: Path, tmp_path: Path, *args: str, **env: str
) -> Iterator[tuple[subprocess.Popen[str], list[str], list[str]]]:
    """start_cli_serve, and the process killed (if still running) and reaped afterwards."""
    proc, ports, lines = start_cli_serve(repo, tmp_path, *args, **env)
    try:
        yield proc, ports, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
