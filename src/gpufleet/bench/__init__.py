"""Cluster benchmarks run as gpufleet jobs: collectives (and, next, scaling and coordinated
runs). Each benchmark is a worker module started by the same launcher as training, so it runs
here on loopback and, rendered from the same spec, across a cluster's nodes."""
