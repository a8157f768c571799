"""The system description that goes with every benchmark result: hardware, driver, versions."""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import gpufleet


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> dict[str, Any]:
    """GPU names, memory and the driver from NVML (nvidia-ml-py); empty without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no GPUs to describe
        return {}
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            names.append(
                f"{name.decode() if isinstance(name, bytes) else name} ({int(mem) / 2**30:.0f} GiB)"
            )
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {"gpus": names, "driver": driver.decode() if isinstance(driver, bytes) else driver}
    finally:
        pynvml.nvmlShutdown()


def _nccl_version(torch: Any) -> str:
    if not torch.cuda.is_available():
        return "none"
    return ".".join(map(str, torch.cuda.nccl.version()))


def describe() -> dict[str, Any]:
    """This machine and its software, as JSON-able data."""
    import psutil
    import torch

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "gpufleet": gpufleet.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "nccl": _nccl_version(torch),
        "gpus": [],
        "driver": "none",
    }
    info.update(_gpus())
    return info


def local_world_size() -> int:
    """Workers per node (torchrun's LOCAL_WORLD_SIZE; 1 outside it)."""
    return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)


def nodes_of(world_size: int) -> int:
    """How many nodes a job of ``world_size`` workers spans."""
    return max(world_size // local_world_size(), 1)


def node_systems() -> list[dict[str, Any]]:
    """Every node's description, gathered over the process group (collective: every rank
    calls it): the first rank of each node speaks for it, with its ``rank``."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": dist.get_rank(), **describe()})
    return [s for s in gathered if s["rank"] % local_world_size() == 0]
