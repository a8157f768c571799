"""The Ray framework (spec.framework ray): ``gpufleet run`` starts a Ray cluster on this machine
(``cluster``: a head and one Ray node per spec node, `ray start` processes) and runs the job's
driver against it: a command, or ``python -m gpufleet.frameworks.ray`` (``driver``), which
trains the digits workload with Ray Train's TorchTrainer (``train``: each worker's loop)."""

__all__ = ["ENV_RAY_MAX_FAILURES", "ENV_RAY_USE_GPU", "ENV_RAY_WORKERS", "RAY_ENV"]

# What the launcher tells the driver (besides RAY_ADDRESS and the job's GPUFLEET_* context).
ENV_RAY_WORKERS = "GPUFLEET_RAY_WORKERS"  # Ray Train workers: spec.nodes x spec.procsPerNode
ENV_RAY_MAX_FAILURES = "GPUFLEET_RAY_MAX_FAILURES"  # spec.maxRestarts: Ray's FailureConfig
ENV_RAY_USE_GPU = "GPUFLEET_RAY_USE_GPU"  # "1": one GPU per Train worker (spec.resources.gpu)
# What every Ray process of a job gets, here and in pods: no usage stats sent, and a Train
# worker's print() printed once (Ray Train also logs it by default: twice).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
