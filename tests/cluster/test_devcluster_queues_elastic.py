"""The elastic controller's rounds against the real Kueue (issue 56, item 2), on the session's
local cluster with the chart's lab (research 6 GPUs, borrows 2, lends 4; product 6, lends 2;
kwok's 3 nodes x 4 A30): a job of range 1-2 nodes x 4 GPUs waits at 2 while product holds 6
and is set to 1, which Kueue admits; once product's job is gone it grows to 2, the new slice
admitted for the difference; product's job of 6 then reclaims the 2 research borrows, Kueue
evicts the whole job, and the controller sets it to 1, admitted again at once. `gpufleet
status` tells the size and the resizes. (The same on real nodes, with training and the weights:
test_realnodes_elastic.py.)"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from gpufleet.cluster.elastic import demand, quotas
from gpufleet.cluster.elastic_loop import one_round, run
from gpufleet.cluster.kinds import CLUSTER_QUEUES
from gpufleet.cluster.resizes import resizes
from gpufleet.devcluster.kwok import RUN_FOR_A_DAY
from gpufleet.errors import ClusterError, UserInputError
from tests.cluster.test_devcluster_queues import submit_annotated
from tests.support.devcluster import DevCluster, condition, needs_controlplane
from tests.support.devlab import queued_job, tenant_leftovers
from tests.support.procs import poll_until

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]

NAMES = ("stretch", "holder", "reclaimer")  # this module's jobs


def job(lab: DevCluster, name: str) -> dict[str, Any]:
    return lab.as_dict(lab.typed("BatchV1Api").read_namespaced_job(name, "research"))


def admitted_slices(lab: DevCluster, name: str) -> list[dict[str, Any]]:
    """The job's admitted, unfinished Workloads (slices)."""
    return [
        wl
        for wl in lab.workloads("research")
        if condition(wl, "Admitted")
        and not condition(wl, "Finished")
        and name in [o["name"] for o in wl["metadata"].get("ownerReferences") or []]
    ]


def admitted_size(lab: DevCluster, name: str) -> int | None:
    """The pod count of the job's admitted slice, if any."""
    slices = admitted_slices(lab, name)
    return int(slices[0]["spec"]["podSets"][0]["count"]) if slices else None


def counted_as_kueue_reserved(lab: DevCluster, name: str) -> bool:
    """Whether what the controller counts for the job's admitted slice (its ``demand``:
    Kueue's resourceUsage, LimitRange defaults included) is what Kueue reserved for it in
    research's ClusterQueue, where it is alone, resource by resource (the ClusterQueue's
    status follows the admission)."""
    slices = admitted_slices(lab, name)
    queue = lab.custom.get_cluster_custom_object(
        CLUSTER_QUEUES.group, CLUSTER_QUEUES.version, CLUSTER_QUEUES.plural, "research"
    )
    reserved = {res: q.used for (_, res), q in quotas(queue).items() if q.used}
    counted = demand(slices[0]) if len(slices) == 1 else {}
    return bool(reserved) and reserved == {res: counted.get(res) for res in reserved}


def rounds_until(lab: DevCluster, what: str, done: Any) -> Any:
    """The controller's rounds, here, until ``done()``."""
    return poll_until(lambda: (one_round(lab.custom), done())[1], what=what, timeout=90,
                      interval=0.5)  # fmt: skip


def test_an_elastic_job_on_kueue_is_sized_to_the_quota_that_frees_and_is_left(
    lab: DevCluster,
) -> None:
    elastic = queued_job("stretch", "research", 2, 4, target="job", minNodes=1)
    holder = queued_job("holder", "product", 2, 3, target="job")
    reclaimer = queued_job("reclaimer", "product", 2, 3, target="job")
    try:
        submit_annotated(lab, holder, "job", RUN_FOR_A_DAY)
        poll_until(lambda: lab.phase("holder", "product") == "Running", what="holder running",
                   timeout=90)  # fmt: skip
        submit_annotated(lab, elastic, "job", RUN_FOR_A_DAY)
        # the CLI's one round first, then this process's: waits at 2 (8 GPUs; 6 free), set to 1
        done = lab.gpufleet("elastic-controller", "--once")
        assert done.returncode == 0, done.stderr[-2000:]
        rounds_until(lab, "admitted at 1", lambda: admitted_size(lab, "stretch") == 1)
        poll_until(lambda: counted_as_kueue_reserved(lab, "stretch"), timeout=30,
                   what="the controller's count of the job to be Kueue's reservation")  # fmt: skip
        assert lab.cancel("holder", "product")
        stop = threading.Event()
        loop = threading.Thread(target=run, args=(lab.custom, stop, 0.5), daemon=True)
        loop.start()
        try:
            poll_until(lambda: admitted_size(lab, "stretch") == 2, what="grown to 2",
                       timeout=90)  # fmt: skip
        finally:
            stop.set()
            loop.join(timeout=30)
        submit_annotated(lab, reclaimer, "job", RUN_FOR_A_DAY)
        rounds_until(lab, "readmitted at 1", lambda: admitted_size(lab, "stretch") == 1
                     and job(lab, "stretch")["spec"]["parallelism"] == 1)  # fmt: skip
        history = resizes(job(lab, "stretch"))
        assert [(r["from"], r["to"], r["cause"]) for r in history] == [
            (2, 1, "admitted at the size that fits"), (1, 2, "quota freed in cohort lab"),
            (2, 1, "reclaimed by product")]  # fmt: skip
        status = lab.gpufleet("status", "stretch", "-n", "research")
        assert "size 1 of 1–2 nodes; shrank 2→1 at " in status.stdout, status.stdout
        assert "(reclaimed by product)" in status.stdout
        assert "(quota freed in cohort lab)" in status.stdout  # the earlier ones, below
    finally:
        for name, namespace in (("stretch", "research"), ("holder", "product"),
                                ("reclaimer", "product")):  # fmt: skip
            with contextlib.suppress(ClusterError, UserInputError):  # cancelled already
                lab.cancel(name, namespace)
        # gone before the next module: its pods and Workloads would count in Kueue's usage
        poll_until(
            lambda: not tenant_leftovers(lab, NAMES),
            what="the jobs' pods and Workloads gone",
            timeout=120,
        )
