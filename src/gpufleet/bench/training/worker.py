"""The worker of ``gpufleet bench training`` (MLPerf Training-style time to target): train
the digits CNN with the Trainer until its test accuracy reaches the target, on every node of
the job at once, and log the run in MLLOG lines with mlperf-logging's own logger, as MLPerf
Training submissions do.

One job, ``--runs`` runs (seeds ``seed``, ``seed+1``, ...), one ``result_<i>.txt`` each. The
score is MLPerf's: minutes from ``run_start`` to ``run_stop``, averaged over the runs with the
fastest and the slowest dropped when there are at least three (olympic average). Rank 0 logs;
every node's system description is gathered to it. Results are published with fsspec to
``--results`` (a directory on the shared checkpoint volume, or an S3 URI), where
``gpufleet bench collect`` reads them, checks each log with mlperf-logging's compliance
checker (against gpufleet's ruleset, gpufleet.bench.mlperf) and prints the aggregate.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpufleet.bench.training.config import BENCHMARK, RESULT_JSON, TARGET_ACCURACY, TrainingConfig
from gpufleet.bench.training.mllog import EpochLog, mllogger, setup_events


def fresh_context(index: int) -> Any:
    """This run's JobContext: a run directory of its own, emptied first, no checkpoints."""
    import torch.distributed as dist

    from gpufleet.runtime import JobContext
    from gpufleet.runtime.distributed import init_distributed

    base = JobContext.from_env()
    # Each run trains from scratch, in a checkpoint directory of its own, emptied first: never
    # resumed from an earlier run (or an earlier job) of this benchmark. No periodic saves
    # either: they would time checkpoint I/O, not training.
    context = replace(
        base,
        run_dir=base.run_dir / f"training-run-{index}",
        checkpoint=replace(base.checkpoint, dir=None, every_steps=10**9),
    )
    if init_distributed().local_rank == 0:
        shutil.rmtree(context.run_dir, ignore_errors=True)
    dist.barrier()
    return context


def one_run(args: argparse.Namespace, index: int, nodes: int, staging: Path) -> dict[str, Any]:
    """One timed run to the target; returns its row (rank 0's is the one kept)."""
    import torch.distributed as dist
    from mlperf_logging.mllog import constants as c

    from gpufleet.runtime import Trainer, TrainerConfig
    from gpufleet.runtime.distributed import init_distributed
    from gpufleet.workloads.digits import digits_datasets, digits_recipe

    info = init_distributed()
    seed = args.seed + index
    log = mllogger(staging / f"result_{index}.txt" if info.is_main else None, index)
    log.event(c.CACHE_CLEAR, True)
    log.start(c.INIT_START)
    context = fresh_context(index)
    world = info.world_size
    train, test = digits_datasets(0)  # the split is the benchmark's, not the run's
    steps_per_epoch = len(train) // (args.batch_size * world)
    max_steps = steps_per_epoch * args.max_epochs
    recipe = digits_recipe(lr=args.lr, steps=max_steps, seed=seed)
    cfg = TrainerConfig(steps=max_steps, batch_size=args.batch_size, seed=seed, log_every=10**9)
    for key, value in setup_events(
        args, seed=seed, nodes=nodes, world=world, gpus=info.device.type == "cuda",
        settings=context.parallelism, train_samples=len(train), eval_samples=len(test),
        max_steps=max_steps):  # fmt: skip
        log.event(key, value)
    epochs = EpochLog(log, test, steps_per_epoch=steps_per_epoch,
                      samples_per_step=args.batch_size * world,
                      max_epochs=args.max_epochs)  # fmt: skip
    trainer = Trainer(recipe.model, train, recipe.optimizer, config=cfg,
                      scheduler=recipe.scheduler, context=context,
                      after_step=epochs.after_step)  # fmt: skip
    epochs.model = trainer.model
    dist.barrier()  # every rank is ready: the clock starts for all of them at once
    log.end(c.INIT_STOP)
    log.start(c.RUN_START)
    epochs.start_epoch(1)
    result = trainer.fit()
    status = c.SUCCESS if epochs.reached() else c.ABORTED
    log.end(c.RUN_STOP, metadata={c.STATUS: status})
    for handler in log.logger.handlers:
        handler.close()
    history = epochs.history
    return {"run": index, "seed": seed, "result_file": f"result_{index}.txt", "status": status,
            "epochs": len(history), "steps": result.steps,
            "accuracy": history[-1] if history else None, "accuracy_history": history,
            "preempted": result.preempted}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Every run in this worker; rank 0 publishes the logs and training.json to --results."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet.bench.training")
    defaults = TrainingConfig()
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="per worker")
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--max-epochs", type=int, default=defaults.max_epochs)
    parser.add_argument("--org", default=defaults.org)
    parser.add_argument("--platform", default=defaults.platform)
    parser.add_argument("--config-name", default=defaults.config_name)
    parser.add_argument("--results", default=None, help="directory or fsspec URI")
    args = parser.parse_args(argv)

    from gpufleet.bench.jobs import publish
    from gpufleet.bench.system import node_systems, nodes_of
    from gpufleet.runtime import JobContext
    from gpufleet.runtime.distributed import ensure_process_group, init_distributed
    from gpufleet.runtime.files import write_json_atomic

    info = init_distributed()
    ensure_process_group()
    nodes = nodes_of(info.world_size)
    run_dir = Path(os.environ.get("GPUFLEET_RUN_DIR", "."))
    results = args.results or str(run_dir / "training")
    staging = run_dir / "bench-training"  # this node's copy; `results` is the shared one
    if info.is_main:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    runs = [one_run(args, i, nodes, staging) for i in range(args.runs)]
    systems = node_systems()
    if info.is_main:
        summary = {
            "benchmark": BENCHMARK,
            "target_accuracy": TARGET_ACCURACY,
            "nodes": nodes,
            "world_size": info.world_size,
            "batch_per_worker": args.batch_size,
            "global_batch": args.batch_size * info.world_size,
            "parallelism": JobContext.from_env().parallelism.to_json(),
            "runs": runs,
            "systems": systems,  # one per node
        }
        # the logs first: a collector that sees training.json finds every log it names
        publish(sorted(staging.glob("result_*.txt")), results)
        write_json_atomic(staging / RESULT_JSON, summary)
        publish([staging / RESULT_JSON], results)
        print(f"training: {len(runs)} run(s) written to {results}", flush=True)
    return 0
