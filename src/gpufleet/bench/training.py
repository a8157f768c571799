"""MLPerf Training-style time to target (``gpufleet bench training``): train the digits CNN with
the Trainer until its test accuracy reaches the target, on every node of the job at once, and
log the run in MLLOG lines with mlperf-logging's own logger, as MLPerf Training submissions do.

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
import logging
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

BENCHMARK = "gpufleet_digits"
TARGET_ACCURACY = 0.97  # top-1 on the held-out 20 % of digits; fixed, as MLPerf's targets are
RESULT_JSON = "training.json"


def olympic_minutes(minutes: list[float], runs: int) -> float | None:
    """MLPerf's score of ``runs`` runs of which ``minutes`` passed (converged and compliant),
    as mlperf_logging.result_summarizer scores them (its olympic average is private there).
    From three runs on, the fastest and the slowest are dropped and the rest averaged; a run
    that failed counts as the dropped slowest, and more than one failed gives no score. Below
    three runs every run must pass and all count."""
    most_dropped = 1 if runs >= 3 else 0
    dropped = runs - len(minutes)
    if dropped > most_dropped or not minutes:
        return None
    ordered = sorted(minutes)
    countable = ordered[most_dropped : len(ordered) - (most_dropped - dropped)]
    return sum(countable) / len(countable) if countable else None


def collect(results: str, workdir: Path) -> dict[str, Any]:
    """Fetch a run's files from ``results`` (a directory or an fsspec URI) into ``workdir``,
    check every run's log with mlperf-logging's compliance checker, and score the set: the
    collector step of a cluster run, and the end of a local one. Raises FileNotFoundError when
    ``results`` holds no training.json."""
    import fsspec

    from gpufleet.bench.mlperf import check, run_minutes
    from gpufleet.runtime.files import read_json

    fs, root = fsspec.core.url_to_fs(results)
    local = workdir / "logs"
    local.mkdir(parents=True, exist_ok=True)
    if not fs.isfile(f"{root.rstrip('/')}/{RESULT_JSON}"):
        raise FileNotFoundError(f"{results}: no {RESULT_JSON} (has the benchmark finished?)")
    for entry in fs.ls(root, detail=False):
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if name == RESULT_JSON or (name.startswith("result_") and name.endswith(".txt")):
            fs.get_file(entry, str(local / name))
    summary: dict[str, Any] = read_json(local / RESULT_JSON) or {}
    passed = []
    for run in summary["runs"]:
        log = local / run["result_file"]
        verdict = check(log, workdir / "compliance")
        run["minutes"] = run_minutes(log) if log.is_file() else None
        run["compliant"], run["problems"] = verdict.valid, verdict.problems
        if verdict.valid and run["status"] == "success" and run["minutes"] is not None:
            passed.append(run["minutes"])
    score = olympic_minutes(passed, len(summary["runs"]))
    summary["aggregate"] = {
        "runs": len(summary["runs"]),
        "passed": len(passed),
        "score_minutes": score,
        "valid": score is not None,
        "ruleset": "gpufleet_digits on mlperf-logging training 6.1.0 common rules",
    }
    summary["logs"] = str(local)
    return summary


def table(summary: dict[str, Any]) -> list[str]:
    """Per-run rows and the score, as text lines."""
    lines = [f"{'run':<5}{'seed':>5}  {'status':<9}{'epochs':>7}{'accuracy':>10}{'minutes':>10}"
             f"  compliance"]  # fmt: skip
    for r in summary["runs"]:
        acc = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "-"
        mins = f"{r['minutes']:.4f}" if r["minutes"] is not None else "-"
        verdict = "ok" if r["compliant"] else "; ".join(r["problems"][:2]) or "failed"
        lines.append(f"{r['run']:<5}{r['seed']:>5}  {r['status']:<9}{r['epochs']:>7}{acc:>10}"
                     f"{mins:>10}  {verdict}")  # fmt: skip
    agg = summary["aggregate"]
    score = f"{agg['score_minutes']:.4f} min" if agg["score_minutes"] is not None else "none"
    verdict = "VALID" if agg["valid"] else "INVALID"
    lines.append(
        f"time to {summary['target_accuracy']:.0%} ({summary['benchmark']}, "
        f"{summary['nodes']} node(s), {summary['world_size']} worker(s), global batch "
        f"{summary['global_batch']}): {score}, {agg['passed']}/{agg['runs']} runs passed, "
        f"{verdict}"
    )
    return lines


def plot(summary: dict[str, Any], path: Path) -> None:
    """Test accuracy per epoch of every run, and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in summary["runs"]:
        history = r["accuracy_history"]
        ax.plot(range(1, len(history) + 1), history, marker="o", label=f"run {r['run']}")
    ax.axhline(summary["target_accuracy"], color="k", linestyle="--", label="target")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1.0)
    ax.set_title(f"{summary['benchmark']}: {summary['world_size']} workers")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _mllogger(path: Path | None, index: int) -> Any:
    """An MLLogger writing to ``path`` (rank 0), or to nowhere (the other ranks)."""
    from mlperf_logging.mllog.mllog import MLLogger

    logger = logging.getLogger(f"gpufleet.mllog.{index}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.addHandler(logging.FileHandler(path) if path else logging.NullHandler())
    return MLLogger(logger=logger)


def _precision(mixed: str) -> str:
    return "bfloat16" if mixed == "bf16" else "fp32"


def one_run(args: argparse.Namespace, index: int, nodes: int, staging: Path) -> dict[str, Any]:
    """One timed run to the target; returns its row (rank 0's is the one kept)."""
    import torch
    import torch.distributed as dist
    from mlperf_logging.mllog import constants as c

    from gpufleet.runtime import JobContext, Trainer, TrainerConfig, seed_everything
    from gpufleet.runtime.distributed import init_distributed
    from gpufleet.workloads.digits import DigitsCNN, accuracy, digits_datasets

    info = init_distributed()
    seed = args.seed + index
    path = staging / f"result_{index}.txt" if info.is_main else None
    log = _mllogger(path, index)
    log.event(c.CACHE_CLEAR, True)
    log.start(c.INIT_START)
    base = JobContext.from_env()
    # Each run trains from scratch, in a checkpoint directory of its own, emptied first: never
    # resumed from an earlier run (or an earlier job) of this benchmark. No periodic saves
    # either: they would time checkpoint I/O, not training.
    context = replace(
        base,
        run_dir=base.run_dir / f"training-run-{index}",
        checkpoint=replace(base.checkpoint, dir=None, every_steps=10**9),
    )
    if info.local_rank == 0:
        shutil.rmtree(context.run_dir, ignore_errors=True)
    dist.barrier()
    settings = context.parallelism
    world = info.world_size
    train, test = digits_datasets(0)  # the split is the benchmark's, not the run's
    seed_everything(seed)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = len(train) // (args.batch_size * world)
    max_steps = steps_per_epoch * args.max_epochs
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max_steps)
    cfg = TrainerConfig(steps=max_steps, batch_size=args.batch_size, seed=seed, log_every=10**9)
    for key, value in (
        (c.SUBMISSION_ORG, args.org),
        (c.SUBMISSION_PLATFORM, args.platform or f"{nodes}x{os.uname().machine}"),
        (c.SUBMISSION_DIVISION, "closed"),
        (c.SUBMISSION_STATUS, "onprem"),
        (c.SUBMISSION_BENCHMARK, BENCHMARK),
        ("number_of_nodes", nodes),  # read by mlperf_logging.result_summarizer
        ("accelerators_per_node", world // nodes if info.device.type == "cuda" else 0),
        (c.SEED, seed),
        (c.GLOBAL_BATCH_SIZE, args.batch_size * world),
        (c.GRADIENT_ACCUMULATION_STEPS, settings.gradient_accumulation),
        (c.MICRO_BATCH_SIZE, args.batch_size // settings.gradient_accumulation),
        (c.TRAIN_SAMPLES, len(train)),
        (c.EVAL_SAMPLES, len(test)),
        (c.OPT_NAME, "sgd"),
        (c.OPT_BASE_LR, args.lr),
        (c.OPT_LR_DECAY_SCHEDULE, "cosine"),
        (c.OPT_LR_DECAY_STEPS, max_steps),
        (c.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, _precision(settings.mixed_precision)),
        # The CNN has no attention; MLPerf 6.1 asks for the field regardless.
        (c.LOWEST_NUMERICAL_PRECISION_IN_ATTN, _precision(settings.mixed_precision)),
        (c.LOWEST_NUMERICAL_PRECISION_IN_COMM, "fp32"),  # both strategies reduce in fp32
        (c.TENSOR_PARALLELISM, 1),
        (c.PIPELINE_PARALLELISM, 1),
        (c.CONTEXT_PARALLELISM, 1),
        (c.EXPERT_PARALLELISM, 1),
        (c.CONFIG_FILENAME, args.config_name),
        ("gpufleet_strategy", settings.strategy),
    ):
        log.event(key, value)
    history: list[float] = []

    def start_epoch(epoch: int) -> None:
        log.start(c.BLOCK_START, metadata={c.FIRST_EPOCH_NUM: epoch, c.EPOCH_COUNT: 1})
        log.start(c.EPOCH_START, metadata={c.EPOCH_NUM: epoch})

    def after_step(step: int) -> bool:
        if step % steps_per_epoch:
            return False
        epoch = step // steps_per_epoch
        samples = step * args.batch_size * world
        log.end(c.EPOCH_STOP, metadata={c.EPOCH_NUM: epoch})
        log.end(c.BLOCK_STOP, metadata={c.FIRST_EPOCH_NUM: epoch})
        log.start(c.EVAL_START, metadata={c.EPOCH_NUM: epoch})
        score = accuracy(trainer.model, test)  # every rank: FSDP's forward needs them all
        history.append(score)
        meta = {c.EPOCH_NUM: epoch, c.SAMPLES_COUNT: samples}
        log.event(c.EVAL_ACCURACY, score, metadata=meta)
        log.end(c.EVAL_STOP, metadata={c.EPOCH_NUM: epoch})
        if score >= TARGET_ACCURACY:
            return True
        if epoch < args.max_epochs:
            start_epoch(epoch + 1)
        return False

    trainer = Trainer(
        model, train, opt, config=cfg, scheduler=sched, context=context, after_step=after_step
    )
    dist.barrier()  # every rank is ready: the clock starts for all of them at once
    log.end(c.INIT_STOP)
    log.start(c.RUN_START)
    start_epoch(1)
    result = trainer.fit()
    reached = bool(history) and history[-1] >= TARGET_ACCURACY
    status = c.SUCCESS if reached else c.ABORTED
    log.end(c.RUN_STOP, metadata={c.STATUS: status})
    for handler in log.logger.handlers:
        handler.close()
    return {
        "run": index,
        "seed": seed,
        "result_file": f"result_{index}.txt",
        "status": status,
        "epochs": len(history),
        "steps": result.steps,
        "accuracy": history[-1] if history else None,
        "accuracy_history": history,
        "preempted": result.preempted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.bench.training")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--max-epochs", type=int, default=40)
    parser.add_argument("--org", default="gpufleet")
    parser.add_argument("--platform", default="")
    parser.add_argument("--config-name", default="gpufleet bench training")
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


if __name__ == "__main__":
    sys.exit(main())
