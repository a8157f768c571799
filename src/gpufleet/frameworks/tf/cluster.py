"""A TensorFlow worker's cluster: TF_CONFIG as tf.distribute's cluster resolver reads it.

Kubeflow's TFJob sets TF_CONFIG in each pod itself; it is used as given. Elsewhere gpufleet
builds it: the launcher names every worker's address in GPUFLEET_TF_WORKERS (here: one free
port on 127.0.0.1 each; in an Indexed Job or a JobSet: each pod's name under the job's headless
Service, on TF_PORT) and the worker is the task of index GPUFLEET_TF_INDEX, else the pod's
completion index (JOB_COMPLETION_INDEX, which the Job controller sets in an Indexed Job's pods),
else its torchrun rank (here every address is this machine's, so any order will do).
Imports no TensorFlow: the launcher and the renderers use it too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ENV_TF_CONFIG = "TF_CONFIG"
ENV_TF_WORKERS = "GPUFLEET_TF_WORKERS"  # host:port of every worker, comma-separated, by index
ENV_TF_INDEX = "GPUFLEET_TF_INDEX"
TF_PORT = 2222  # the port Kubeflow's TFJob gives each replica: one convention for every target


class ClusterConfigError(ValueError):
    """TF_CONFIG cannot be built from the environment."""


def tf_config(env: Mapping[str, str]) -> dict[str, Any] | None:
    """This worker's TF_CONFIG: one built from GPUFLEET_TF_WORKERS and the worker's index when
    gpufleet named the workers (a TF_CONFIG around ``gpufleet run`` is not this job's), else
    the environment's own (a TFJob's); None for a single worker with neither."""
    workers = [w for w in env.get(ENV_TF_WORKERS, "").split(",") if w]
    given = env.get(ENV_TF_CONFIG)
    if given and not workers:
        try:
            config: dict[str, Any] = json.loads(given)
        except ValueError as exc:
            raise ClusterConfigError(f"{ENV_TF_CONFIG} is not JSON: {exc}") from None
        return config
    if not workers:
        return None
    raw = env.get(ENV_TF_INDEX) or env.get("JOB_COMPLETION_INDEX") or env.get("RANK")
    if raw is None or not raw.isdigit() or int(raw) >= len(workers):
        raise ClusterConfigError(
            f"worker index {raw!r} ({ENV_TF_INDEX}, else JOB_COMPLETION_INDEX, else RANK) is "
            "not one of the "
            f"{len(workers)} workers of {ENV_TF_WORKERS}"
        )
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(raw)}}


def local_workers(ports: list[int]) -> str:
    """GPUFLEET_TF_WORKERS for workers on this machine, one port each."""
    return ",".join(f"127.0.0.1:{port}" for port in ports)


def pod_workers(hosts: list[str]) -> str:
    """GPUFLEET_TF_WORKERS for one worker per pod, each on TF_PORT."""
    return ",".join(f"{host}:{TF_PORT}" for host in hosts)
