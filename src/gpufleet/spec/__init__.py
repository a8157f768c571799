"""User-facing kinds (pydantic models) and the loader that reports every error with its path."""

from gpufleet.spec.inference import InferenceService
from gpufleet.spec.loader import (
    Spec,
    load_spec,
    load_training_job,
    parse_override,
    validate_spec,
    validate_training_job,
)
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
    "InferenceService",
    "Metadata",
    "Preemption",
    "Resources",
    "Spec",
    "SyntheticWorkload",
    "TrainingJob",
    "TrainingJobSpec",
    "Volume",
    "load_spec",
    "load_training_job",
    "parse_override",
    "validate_spec",
    "validate_training_job",
]
