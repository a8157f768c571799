"""Talking to a cluster: submit rendered jobs, fold their status, read logs, cancel."""

from gpufleet.cluster.client import Cluster
from gpufleet.cluster.kinds import JOB_KINDS
from gpufleet.cluster.status import JobStatus, explain_scheduling, summarize
from gpufleet.errors import ClusterError

__all__ = ["JOB_KINDS", "Cluster", "ClusterError", "JobStatus", "explain_scheduling", "summarize"]
