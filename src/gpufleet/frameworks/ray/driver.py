"""The driver of a Ray job's built-in workload: connects to the job's Ray cluster (RAY_ADDRESS)
and runs Ray Train's TorchTrainer over ``train.train_loop``, with Ray's failure handling
(FailureConfig: spec.maxRestarts restarts of the worker group, each resuming from the last
checkpoint) and Ray's checkpoint persistence into the job's checkpoint directory (RunConfig: its
parent as storage_path, its name as the run's name, so Ray's files and gpufleet's step
directories share it)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from gpufleet.errors import EXIT_FAILED, EXIT_OK
from gpufleet.frameworks.ray import ENV_RAY_MAX_FAILURES, ENV_RAY_USE_GPU, ENV_RAY_WORKERS
from gpufleet.frameworks.ray.train import FATAL_RECORD, STARTS, log, train_loop
from gpufleet.launch.fatal import write_fatal
from gpufleet.runtime.context import JobContext
from gpufleet.runtime.files import read_json


def absolute(context: JobContext) -> JobContext:
    """``context`` with its run and checkpoint directories absolute: Ray's workers run in
    directories of Ray's own."""
    root = Path(context.checkpoint_root.removeprefix("file://")).resolve()
    checkpoint = dataclasses.replace(context.checkpoint, dir=str(root))
    return dataclasses.replace(context, run_dir=context.run_dir.resolve(), checkpoint=checkpoint)


def _workers_have_cuda(ray: Any) -> bool:
    """Whether a Ray node that offers a GPU can use it (a GPU node's scheduling resource
    without a CUDA device, as a lab's stand-in GPUs: the workers train on the CPU, with gloo,
    as a PyTorch job's do)."""

    def probe() -> bool:
        import torch

        return bool(torch.cuda.is_available())

    usable = bool(ray.get(ray.remote(num_gpus=1, num_cpus=0)(probe).remote(), timeout=300))
    if not usable:
        log("gpufleet: WARNING the Ray nodes offer GPUs but CUDA sees none: training on the CPU")
    return usable


def main() -> int:
    """Train the workload named in GPUFLEET_WORKLOAD; 0, or the fatal error's exit code."""
    context = absolute(JobContext.from_env())
    if context.workload.get("name") != "digits":
        log(f"gpufleet: no Ray workload {context.workload.get('name')!r}")
        return 2
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    context.run_dir.mkdir(parents=True, exist_ok=True)
    (context.run_dir / STARTS).unlink(missing_ok=True)  # this launch's restarts only
    root = Path(context.checkpoint_root)
    # Ray's record of the checkpoints of an earlier launch: its manager would restore it and
    # delete those it no longer keeps, a set-aside one included (a controller error). Worker 0
    # picks the checkpoint to resume and keeps spec.checkpoint.keep of them instead.
    (root / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).unlink(missing_ok=True)
    (root / FATAL_RECORD).unlink(missing_ok=True)  # an earlier launch's
    ray.init(log_to_driver=True)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"env": context.to_env()},
        scaling_config=ray.train.ScalingConfig(
            num_workers=int(os.environ.get(ENV_RAY_WORKERS, "1")),
            use_gpu=os.environ.get(ENV_RAY_USE_GPU) == "1" and _workers_have_cuda(ray),
            resources_per_worker={"CPU": 1},
        ),
        run_config=ray.train.RunConfig(
            name=root.name,
            storage_path=str(root.parent),
            failure_config=ray.train.FailureConfig(
                max_failures=int(os.environ.get(ENV_RAY_MAX_FAILURES, "0"))
            ),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
        ),
    )
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log(f"gpufleet: Ray Train gave up after its restarts: {first[:500]}")
        return EXIT_FAILED
    finally:
        ray.shutdown()
    fatal = read_json(root / FATAL_RECORD)
    if not fatal:
        return EXIT_OK
    (root / FATAL_RECORD).unlink(missing_ok=True)
    code, message = int(fatal["exit_code"]), str(fatal["message"])
    write_fatal(context.run_dir, code, message, 0)  # for `gpufleet run`'s summary
    log(f"gpufleet: {message}")
    return code
