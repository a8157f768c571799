"""Backends that start jobs: the local one (PyTorch's elastic launcher) for now.

Import ``gpufleet.launch.local`` for ``run_local``; this package itself imports nothing heavy,
so ``gpufleet.launch.worker`` (used by the renderers) does not pull in torch.
"""
