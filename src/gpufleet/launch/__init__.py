"""Starting workers: the local backend (PyTorch's elastic agent, ``local`` and ``node``), the
worker shim, the in-pod launcher (``pod``), what a worker is anywhere (``worker``, shared with
the renderers) and the job metrics server. On a cluster the engines (Job, JobSet, Kubeflow,
MPI, Volcano) start the pods; ``gpufleet.render`` and ``gpufleet.cluster`` prepare and submit.

Import ``gpufleet.launch.local`` for ``run_local``; this package itself imports nothing heavy,
so ``gpufleet.launch.worker`` (used by the renderers) does not pull in torch.
"""
