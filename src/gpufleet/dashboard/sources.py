"""Where the dashboard's cluster pages read from: the current kubeconfig's cluster, one list
per kind (gpufleet.cluster.fleet), whatever the number of jobs; `gpufleet dashboard` serves
those lists from a shared watch cache (``ClusterSource.watched``)."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

from gpufleet.cluster.access import as_dict, items
from gpufleet.cluster.apierrors import api_errors, to_cluster_error
from gpufleet.cluster.client import Cluster
from gpufleet.cluster.fleet import AcrossForbidden, Fleet, FleetReader, read_visible
from gpufleet.cluster.jobrows import JobRow, fleet_rows
from gpufleet.cluster.kinds import SCALED_OBJECTS
from gpufleet.cluster.queues import QueueCounts, WaitingJob, counts, waiting_jobs
from gpufleet.dashboard import REFRESH_S
from gpufleet.dashboard.fleetpage import FleetGpus, fleet_gpus
from gpufleet.dashboard.servingpage import ServiceRow, service_rows
from gpufleet.dashboard.utilization import PodTraffic, Utilization, read, traffic
from gpufleet.kube import LABEL_JOB, LABEL_ROLE, ROLE_SERVER, Obj


@dataclass
class Queues:
    """The queues page: what ``gpufleet queues`` prints."""

    cluster_queues: list[QueueCounts]
    local_queues: list[QueueCounts]
    waiting: list[WaitingJob]
    readable: bool  # whether the ClusterQueues could be read


@dataclass
class ClusterSource:
    """A cluster, seen in ``namespace`` or in every namespace the credentials may read."""

    cluster: Cluster
    all_namespaces: bool = True
    # A running job's progress (its pod's metrics, through the API server's proxy) is read again
    # after this many seconds, whoever asks; 0: at every page.
    progress_s: float = 0.0
    prometheus: str | None = None  # where the fleet page reads utilization and GPU health
    _progress: dict[str, tuple[float, list[str]]] = field(default_factory=dict, repr=False)

    @classmethod
    def watched(
        cls, cluster: Cluster, progress_s: float = REFRESH_S, prometheus: str | None = None
    ) -> ClusterSource:
        """``cluster`` with its whole-cluster lists served from a shared watch cache (a page's
        refresh lists nothing: gpufleet.cluster.watchcache), and each running job's progress
        read once per ``progress_s`` for every viewer."""
        from gpufleet.cluster.watchcache import Cached

        apis = {name: Cached(api) for name, api in cluster.apis.items()}
        core = apis.get("CoreV1Api") or Cached(cluster.core)
        return cls(Cluster(Cached(cluster.custom), core, cluster.namespace, apis),
                   progress_s=progress_s, prometheus=prometheus)  # fmt: skip

    def job_metrics(self, pods: list[Obj]) -> list[str]:
        """What the running pods' metrics ports serve, each kept ``progress_s``."""
        if not self.progress_s:
            return self.cluster.job_metrics(pods)
        now, out = time.monotonic(), []
        for pod in pods:
            meta = pod.get("metadata") or {}
            key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
            kept = self._progress.get(key)
            if kept is None or now - kept[0] >= self.progress_s:
                kept = self._progress[key] = (now, self.cluster.job_metrics([pod]))
            out += kept[1]
        self._progress = {k: v for k, v in self._progress.items() if now - v[0] < 60}
        return out

    def fleet(self) -> tuple[Fleet, str | None]:
        """The fleet now, and a note when all namespaces were asked for but not allowed."""
        c = self.cluster
        return read_visible(c.custom, c.core, c.namespace, all_namespaces=self.all_namespaces)

    def in_namespace(self, namespace: str) -> Cluster:
        """The same cluster, in ``namespace``."""
        c = self.cluster
        return Cluster(c.custom, c.core, namespace, c.apis)

    def queues(self, now: dt.datetime) -> Queues:
        """Kueue's queues and the pending Workloads in Kueue's order."""
        c = self.cluster
        fleet, _ = read_visible(c.custom, c.core, c.namespace, all_namespaces=self.all_namespaces,
                                jobs=False)  # fmt: skip
        return Queues(
            cluster_queues=[counts(q, local=False) for q in fleet.cluster_queues or []],
            local_queues=[counts(q, local=True) for q in fleet.local_queues],
            waiting=waiting_jobs(fleet, now),
            readable=fleet.cluster_queues is not None,
        )

    def utilization(self) -> Utilization | None:
        """What the configured Prometheus says of the GPUs (None: none configured)."""
        return read(self.prometheus) if self.prometheus else None

    def gpus(self) -> FleetGpus:
        """The nodes' GPUs and who holds them: every node and pod of the cluster, one list of
        each (the fleet page needs a reader of the whole cluster)."""
        core = self.cluster.core
        try:
            nodes = [as_dict(n) for n in items(core.list_node())]
            pods = [as_dict(p) for p in items(core.list_pod_for_all_namespaces())]
        except api_errors() as exc:
            raise to_cluster_error(exc, "list the nodes and every namespace's pods") from exc
        return fleet_gpus(nodes, pods)

    def traffic(self) -> PodTraffic | None:
        """The serving pods' last minute, from the configured Prometheus (None: none)."""
        return traffic(self.prometheus) if self.prometheus else None

    def services(self, seen: PodTraffic | None = None) -> list[ServiceRow]:
        """Every InferenceService's Triton Deployment with its pods and autoscaler, and what
        Prometheus has ``seen`` of its pods' requests."""
        c = self.cluster
        try:
            return self._services(None if self.all_namespaces else c.namespace, seen)
        except AcrossForbidden:
            return self._services(c.namespace, seen)

    def _services(self, namespace: str | None, seen: PodTraffic | None) -> list[ServiceRow]:
        c = self.cluster
        reader = FleetReader(c.custom, c.core, namespace)
        servers = f"{LABEL_ROLE}={ROLE_SERVER}"
        return service_rows(
            reader.core_objects("deployment", c.apis["AppsV1Api"], label_selector=servers),
            reader.core_objects("pod", label_selector=servers),
            reader.core_objects("horizontal_pod_autoscaler", c.apis["AutoscalingV2Api"],
                                label_selector=LABEL_JOB),
            reader.custom_objects(SCALED_OBJECTS, label_selector=LABEL_JOB) or [],
            seen,
        )  # fmt: skip

    def rows(self, now: dt.datetime) -> list[JobRow]:
        """Every job's row, with the running ones' progress."""
        fleet, _ = self.fleet()
        return fleet_rows(fleet, now, self.job_metrics)
