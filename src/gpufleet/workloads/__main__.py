"""Worker entry point of the built-in workloads: ``python -m gpufleet.workloads``.

Reads the workload from GPUFLEET_WORKLOAD (JSON of the spec's ``workload``), trains it with the
Trainer and writes ``result.json`` for the launcher's summary.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from gpufleet.runtime import JobContext, Trainer, TrainerConfig, seed_everything
from gpufleet.runtime.distributed import init_distributed, shutdown_distributed
from gpufleet.spec import WORKLOAD_KINDS, DigitsWorkload, SyntheticWorkload, WorkloadBase
from gpufleet.workloads.digits import accuracy, digits_datasets, digits_recipe
from gpufleet.workloads.synthetic import synthetic_dataset, synthetic_mlp


def run_digits(w: DigitsWorkload, context: JobContext) -> None:
    """Train the digits CNN by its recipe (SGD + cosine LR); report test accuracy."""
    train, test = digits_datasets(w.seed)
    recipe = digits_recipe(lr=w.lr, steps=w.steps, seed=w.seed)
    cfg = TrainerConfig(steps=w.steps, batch_size=w.batch_size, seed=w.seed, log_every=w.log_every)
    trainer = Trainer(
        recipe.model,
        train,
        recipe.optimizer,
        config=cfg,
        scheduler=recipe.scheduler,
        context=context,
    )
    result = trainer.fit()
    # Every rank evaluates: under FSDP each forward gathers the shards from all of them.
    score = accuracy(trainer.model, test)
    if trainer.info.is_main:
        result.metrics["accuracy"] = score
    trainer.write_result(result)


def run_synthetic(w: SyntheticWorkload, context: JobContext) -> None:
    """Train the synthetic MLP with AdamW."""
    data = synthetic_dataset(w.samples, w.input_size, seed=w.seed)
    seed_everything(w.seed)
    model = synthetic_mlp(w.input_size, w.hidden_size, w.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr)
    cfg = TrainerConfig(steps=w.steps, batch_size=w.batch_size, seed=w.seed, log_every=w.log_every)
    trainer = Trainer(model, data, opt, config=cfg, context=context)
    trainer.write_result(trainer.fit())


# The function that trains each kind of the spec's list (gpufleet.spec.WORKLOAD_KINDS), keyed by
# its model; each takes its own kind's model, hence Any (tests/unit/test_workload_kinds.py checks
# that this covers the list).
RUNNERS: dict[type[WorkloadBase], Callable[[Any, JobContext], None]] = {
    DigitsWorkload: run_digits,
    SyntheticWorkload: run_synthetic,
}


def main() -> int:
    """Run the workload named in GPUFLEET_WORKLOAD."""
    context = JobContext.from_env()
    name = context.workload.get("name")
    init_distributed()
    kind = WORKLOAD_KINDS.get(name) if isinstance(name, str) else None
    if kind is None or kind not in RUNNERS:
        print(f"gpufleet: unknown workload {name!r} in GPUFLEET_WORKLOAD", file=sys.stderr)
        code = 2
    else:
        RUNNERS[kind](kind.model_validate(context.workload), context)
        code = 0
    # A failure raises past this: the shim (gpufleet.launch.shim) prints it, then closes the
    # group without the barrier. A preempted group has met at the barrier and closed it.
    shutdown_distributed()
    return code


if __name__ == "__main__":
    sys.exit(main())
