"""GPU path: nccl with one GPU per process. Runs where CUDA is present, skips elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.cli import run_cli, summary_of
from tests.support.specs import digits_job, write_spec

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_digits_on_gpus_uses_nccl_and_resumes_exactly(workdir: Path) -> None:
    procs = min(2, torch.cuda.device_count())
    doc = digits_job("gpu-digits", procsPerNode=procs, resources={"gpu": procs})
    straight = run_cli("run", str(write_spec(workdir, doc)), "-o", "json", cwd=workdir)
    assert straight.returncode == 0, straight.stderr[-3000:]
    a = summary_of(straight)
    env = dict(__import__("os").environ, GPUFLEET_FAULTS="kill@step=17,rank=0")
    doc2 = digits_job("gpu-chaos", procsPerNode=procs, resources={"gpu": procs})
    chaos = run_cli("run", str(write_spec(workdir, doc2, "c.yaml")), "-o", "json", cwd=workdir,
                    env=env)  # fmt: skip
    assert chaos.returncode == 0, chaos.stderr[-3000:]
    b = summary_of(chaos)
    assert b["restarts"] == 1
    assert a["state_digest"] == b["state_digest"]


def test_a_real_cuda_error_restarts_the_group_and_resumes_exactly(workdir: Path) -> None:
    """The `device` fault on a GPU is a real sticky CUDA error (a device-side assert poisons the
    rank's context, as a lost GPU does): the rank exits at once, the group restarts in new
    processes with fresh contexts, and ends with the uninterrupted run's weights."""
    procs = min(2, torch.cuda.device_count())
    doc = digits_job("gpu-straight", procsPerNode=procs, resources={"gpu": procs})
    straight = run_cli("run", str(write_spec(workdir, doc)), "-o", "json", cwd=workdir)
    assert straight.returncode == 0, straight.stderr[-3000:]
    env = dict(__import__("os").environ, GPUFLEET_FAULTS=f"device@step=17,rank={procs - 1}")
    doc2 = digits_job("gpu-device", procsPerNode=procs, resources={"gpu": procs})
    lost = run_cli("run", str(write_spec(workdir, doc2, "d.yaml")), "-o", "json", cwd=workdir,
                   env=env)  # fmt: skip
    assert lost.returncode == 0, lost.stderr[-3000:]
    assert "CUDA error: device-side assert triggered" in lost.stderr, lost.stderr[-3000:]
    assert "made no step progress" not in lost.stderr
    assert summary_of(lost)["restarts"] == 1
    assert summary_of(lost)["state_digest"] == summary_of(straight)["state_digest"]


def test_worker_sees_its_own_gpu(workdir: Path) -> None:
    procs = min(2, torch.cuda.device_count())
    (workdir / "probe.py").write_text(
        "import json, os\n"
        "from gpufleet.runtime import init_distributed, shutdown_distributed\n"
        "from gpufleet.runtime.distributed import ensure_process_group\n"
        "info = init_distributed()\n"
        "ensure_process_group()  # world size 1 (one GPU) has no group until asked\n"
        "import torch.distributed as dist\n"
        "out = {'device': str(info.device), 'backend': dist.get_backend()}\n"
        "open(f'gpu{info.rank}.json', 'w').write(json.dumps(out))\n"
        "shutdown_distributed()\n"
    )
    doc = digits_job("gpu-probe", procsPerNode=procs, resources={"gpu": procs})
    doc["spec"].pop("workload")
    doc["spec"]["command"] = ["probe.py"]
    proc = run_cli("run", str(write_spec(workdir, doc)), cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(procs):
        got = json.loads((workdir / f"gpu{rank}.json").read_text())
        assert got["device"] == f"cuda:{rank}"
        assert "nccl" in got["backend"]


def test_triton_serves_a_gpu_model_on_cuda(tmp_path: Path) -> None:
    """A KIND_GPU repository served by gpufleet serve runs on CUDA and answers like the model."""
    pytest.importorskip("pytriton")
    import numpy as np
    import tritonclient.grpc as grpcclient

    from gpufleet.net import free_port
    from gpufleet.serve.export import export
    from gpufleet.serve.server import ServeConfig, serving
    from gpufleet.workloads.digits import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN().eval()
    torch.jit.save(torch.jit.script(model), str(tmp_path / "d.pt"))
    export(str(tmp_path / "d.pt"), tmp_path / "repo", name="digits", input_dims=(1, 8, 8), gpu=True)
    config = ServeConfig(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    with serving(tmp_path / "repo", config) as endpoints:
        client = grpcclient.InferenceServerClient(endpoints.grpc)
        x = np.random.rand(16, 1, 8, 8).astype(np.float32)
        inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("digits", [inp]).as_numpy("OUTPUT__0")
        client.close()
        assert torch.cuda.memory_allocated() > 0  # the model ran on the GPU in this process
    np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(), atol=1e-4)


def test_fsdp_bf16_on_gpus_shards_and_resumes_exactly(workdir: Path) -> None:
    """FSDP2 over nccl with bf16 parameters in compute, activation checkpointing and 2
    micro-batches: a crash and restart ends with the uninterrupted run's weights."""
    procs = min(2, torch.cuda.device_count())
    full = {"strategy": "fsdp", "mixedPrecision": "bf16", "activationCheckpointing": True,
            "gradientAccumulation": 2}  # fmt: skip
    docs = [digits_job(name, procsPerNode=procs, resources={"gpu": procs}, parallelism=full)
            for name in ("gpu-fsdp", "gpu-fsdp-chaos")]  # fmt: skip
    straight = run_cli("run", str(write_spec(workdir, docs[0])), "-o", "json", cwd=workdir)
    assert straight.returncode == 0, straight.stderr[-3000:]
    env = dict(__import__("os").environ, GPUFLEET_FAULTS="kill@step=17,rank=0")
    chaos = run_cli("run", str(write_spec(workdir, docs[1], "c.yaml")), "-o", "json",
                    cwd=workdir, env=env)  # fmt: skip
    assert chaos.returncode == 0, chaos.stderr[-3000:]
    a, b = summary_of(straight), summary_of(chaos)
    assert b["restarts"] == 1 and a["state_digest"] == b["state_digest"]
    # It learns in bf16 (chance is 0.1): 40 steps of 32 on one H200 read 0.26, as fp32 DDP's
    # 0.24 there (the same job learns faster on more ranks: more samples per step).
    assert a["accuracy"] > 0.2


def test_collectives_over_nccl_are_checked_and_reported(workdir: Path) -> None:
    """nccl on the GPUs here (one GPU: world size 1, still every op through NCCL)."""
    procs = min(2, torch.cuda.device_count())
    out = workdir / "res"
    sizes = ["--min-bytes", "1MiB", "--max-bytes", "256MiB"]
    proc = run_cli("bench", "collectives", "--procs", str(procs), *sizes, "--outdir", str(out),
                   "-o", "json", cwd=workdir)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert "nccl" in result["backend"] and result["system"]["gpus"]
    assert all(r["correct"] for r in result["rows"])
