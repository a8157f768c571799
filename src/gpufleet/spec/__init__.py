"""User-facing kinds (pydantic models) and the loader that reports every error with its path.

Modules: ``training`` (kind TrainingJob) and ``inference`` (kind InferenceService); their parts
in ``workloads`` (the one list of built-in workload kinds), ``resources``, ``env`` (Secret and
ConfigMap references), ``names`` (Kubernetes names and labels, metadata) and ``validation``
(the base model, field bounds, cross-field rules); ``loader`` reads a file into one of them.
"""

from gpufleet.spec.env import ENV_NAME
from gpufleet.spec.inference import InferenceService
from gpufleet.spec.loader import (
    Spec,
    load_spec,
    load_training_job,
    parse_override,
    validate_spec,
    validate_training_job,
)
from gpufleet.spec.names import API_VERSION, Metadata
from gpufleet.spec.resources import (
    DEFAULT_RDMA_RESOURCE,
    RDMA_RESOURCE_PREFIX,
    Rdma,
    Resources,
    Topology,
    Volume,
)
from gpufleet.spec.training import Checkpoint, Preemption, TrainingJob, TrainingJobSpec
from gpufleet.spec.workloads import (
    WORKLOAD_KINDS,
    DigitsWorkload,
    SyntheticWorkload,
    WorkloadBase,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_RDMA_RESOURCE",
    "ENV_NAME",
    "RDMA_RESOURCE_PREFIX",
    "WORKLOAD_KINDS",
    "Checkpoint",
    "DigitsWorkload",
    "InferenceService",
    "Metadata",
    "Preemption",
    "Rdma",
    "Resources",
    "Spec",
    "SyntheticWorkload",
    "Topology",
    "TrainingJob",
    "TrainingJobSpec",
    "Volume",
    "WorkloadBase",
    "load_spec",
    "load_training_job",
    "parse_override",
    "validate_spec",
    "validate_training_job",
]
