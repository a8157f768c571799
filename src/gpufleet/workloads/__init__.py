"""Built-in workloads: digits (real data, small CNN) and synthetic (sized for benchmarks)."""

from gpufleet.workloads.digits import DigitsCNN, accuracy, digits_datasets
from gpufleet.workloads.synthetic import parameter_bytes, synthetic_dataset, synthetic_mlp

__all__ = [
    "DigitsCNN",
    "accuracy",
    "digits_datasets",
    "parameter_bytes",
    "synthetic_dataset",
    "synthetic_mlp",
]
