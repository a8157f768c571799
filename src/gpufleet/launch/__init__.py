"""Backends that start jobs: the local one (PyTorch's elastic launcher) for now."""

from gpufleet.launch.local import RunSummary, run_local

__all__ = ["RunSummary", "run_local"]
