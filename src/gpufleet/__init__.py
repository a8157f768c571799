"""gpufleet: one job spec for distributed PyTorch training, locally and on Kubernetes."""

from gpufleet.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_HUNG,
    EXIT_OK,
    EXIT_PREEMPTED,
    FieldError,
    GpufleetError,
    UserInputError,
)

__version__ = "0.1.0"

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_HUNG",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "FieldError",
    "GpufleetError",
    "UserInputError",
    "__version__",
]
