"""Observability on the node: the GPU metrics exporter (NVML or simulated devices) and its GPU ->
pod -> job/tenant attribution from the kubelet. Job metrics are written by the workers
(``gpufleet.runtime.metrics``) and served by the launchers (``gpufleet.launch.metrics_server``)."""
