"""User-facing kinds (pydantic models) and the loader that reports every error with its path."""

from gpufleet.spec.loader import load_training_job, parse_override, validate_training_job
from gpufleet.spec.models import (
    API_VERSION,
    Checkpoint,
    DigitsWorkload,
    Metadata,
    Preemption,
    Resources,
    SyntheticWorkload,
    TrainingJob,
    TrainingJobSpec,
    Volume,
)

__all__ = [
    "API_VERSION",
    "Checkpoint",
    "DigitsWorkload",
    "Metadata",
    "Preemption",
    "Resources",
    "SyntheticWorkload",
    "TrainingJob",
    "TrainingJobSpec",
    "Volume",
    "load_training_job",
    "parse_override",
    "validate_training_job",
]
