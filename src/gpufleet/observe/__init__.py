"""Observability: the GPU metrics exporter (NVML) and, later, job metrics."""
