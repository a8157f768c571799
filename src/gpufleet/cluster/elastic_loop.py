"""``gpufleet elastic-controller``: the loop around ``gpufleet.cluster.elastic``'s decisions.

Each round reads the elastic Jobs, Kueue's Workloads, LocalQueues and ClusterQueues, and
patches each Job that needs a resize (its parallelism and completions, and its history). A
patch carries the Job's resourceVersion: a Job that changed since it was read (Kueue suspended
it, say) is left for the next round. The chart runs it as a Deployment whose ServiceAccount may
read those kinds and patch Jobs, and a ValidatingAdmissionPolicy holds its patches to the size
of elastic Jobs (docs/architecture.md, "Elastic jobs"); ``cluster up`` runs none.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
from typing import Any

from gpufleet.cluster.apierrors import api_errors, to_cluster_error
from gpufleet.cluster.elastic import Resize, patch, plan
from gpufleet.cluster.kinds import CLUSTER_QUEUES, JOB_KINDS, LOCAL_QUEUES, WORKLOADS, Kind
from gpufleet.errors import ClusterError
from gpufleet.kube import LABEL_JOB, Obj

BATCH_JOBS = JOB_KINDS[0]
DEFAULT_INTERVAL = 2.0  # seconds between rounds


def _list(custom: Any, kind: Kind, **selectors: str) -> list[Obj]:
    found = custom.list_cluster_custom_object(kind.group, kind.version, kind.plural, **selectors)
    return list(found.get("items") or [])


def one_round(custom: Any, now: dt.datetime | None = None) -> list[Resize]:
    """Read, decide, patch; the resizes made (a Job changed since read is skipped)."""
    jobs = _list(custom, BATCH_JOBS, label_selector=LABEL_JOB)
    decided = plan(jobs, _list(custom, WORKLOADS), _list(custom, LOCAL_QUEUES),
                   _list(custom, CLUSTER_QUEUES))  # fmt: skip
    by_name = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in jobs}
    made = []
    for resize in decided:
        job = by_name[(resize.namespace, resize.name)]
        body = patch(resize, job, now or dt.datetime.now(dt.UTC))
        body["metadata"]["resourceVersion"] = job["metadata"].get("resourceVersion")
        try:
            custom.patch_namespaced_custom_object(
                BATCH_JOBS.group, BATCH_JOBS.version, resize.namespace, BATCH_JOBS.plural,
                resize.name, body)  # fmt: skip
        except api_errors() as exc:
            error = to_cluster_error(exc, f"resize Job {resize.namespace}/{resize.name}")
            print(f"gpufleet elastic: {error}", file=sys.stderr, flush=True)
            continue
        made.append(resize)
        verb = "grew" if resize.new > resize.old else "shrank"
        print(f"gpufleet elastic: {resize.namespace}/{resize.name} {verb} {resize.old}→"
              f"{resize.new} ({resize.cause})", flush=True)  # fmt: skip
    return made


def run(custom: Any, stop: threading.Event, interval: float = DEFAULT_INTERVAL) -> None:
    """Rounds every ``interval`` seconds until ``stop`` is set; a round the API refuses is
    said in one line and the next one tries again."""
    while not stop.is_set():
        try:
            one_round(custom)
        except api_errors() as exc:
            print(f"gpufleet elastic: {to_cluster_error(exc, 'read the cluster')}",
                  file=sys.stderr, flush=True)  # fmt: skip
        except ClusterError as exc:
            print(f"gpufleet elastic: {exc}", file=sys.stderr, flush=True)
        stop.wait(interval)
