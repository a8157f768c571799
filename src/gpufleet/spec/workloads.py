"""The built-in workloads: the one list of their kinds. The spec's ``workload`` field, the
loader and the worker's dispatch (``python -m gpufleet.workloads``) all read it from here."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from gpufleet.spec.validation import INT32_MAX, MAX_BATCH, SpecModel

BATCH_SIZE_HELP = (
    "Samples per step per process. The global batch (this x workers) is fixed by the first "
    "run: a resume at another world size keeps the checkpoint's global batch and splits it."
)


class WorkloadBase(SpecModel):
    """Fields every built-in workload has."""

    seed: int = Field(
        default=0, ge=0, le=2**63 - 1, description="Seed of model init, shuffling and dropout."
    )
    log_every: int = Field(
        default=25, ge=1, le=INT32_MAX, description="Print a progress line every N steps."
    )


class DigitsWorkload(WorkloadBase):
    """Built-in: a small CNN on scikit-learn's bundled 8x8 digits data set (no download)."""

    name: Literal["digits"] = Field(description="Selects this workload.")
    steps: int = Field(default=300, ge=1, le=INT32_MAX, description="Optimizer steps to train.")
    batch_size: int = Field(default=32, ge=1, le=MAX_BATCH, description=BATCH_SIZE_HELP)
    lr: float = Field(default=0.05, gt=0, description="Peak learning rate (SGD, cosine decay).")


class SyntheticWorkload(WorkloadBase):
    """Built-in: an MLP on random data, sized for benchmarks."""

    name: Literal["synthetic"] = Field(description="Selects this workload.")
    steps: int = Field(default=100, ge=1, le=INT32_MAX, description="Optimizer steps to train.")
    batch_size: int = Field(default=64, ge=1, le=MAX_BATCH, description=BATCH_SIZE_HELP)
    lr: float = Field(default=0.01, gt=0, description="Learning rate (AdamW).")
    input_size: int = Field(default=256, ge=1, le=1 << 16, description="Features per sample.")
    hidden_size: int = Field(default=1024, ge=1, le=1 << 16, description="Width of hidden layers.")
    layers: int = Field(default=4, ge=1, le=1024, description="Hidden layers.")
    samples: int = Field(
        default=4096, ge=1, le=1 << 24, description="Size of the synthetic data set."
    )


# The one list of built-in workload kinds. A new kind is a model above, named here, and its
# runner in gpufleet.workloads.__main__.RUNNERS (tests/unit/test_workload_kinds.py checks both).
Workload = Annotated[DigitsWorkload | SyntheticWorkload, Field(discriminator="name")]


def _kind_name(model: type[WorkloadBase]) -> str:
    (name,) = get_args(model.model_fields["name"].annotation)
    return str(name)


# Kind name -> its model, read from the list above in its order (for the loader, the worker).
WORKLOAD_KINDS: dict[str, type[WorkloadBase]] = {
    _kind_name(model): model for model in get_args(get_args(Workload)[0])
}
