"""Elastic jobs under churn on the 50-node design's GPUs (issue 56, item 4): the same stream of
jobs, once elastic (range 1..N nodes, resized by gpufleet's elastic controller) and once at
their fixed size N, on the local control plane with kwok nodes, the chart and the design's
values (15 GPU nodes of 8 "H100": 120 GPUs; tenants llm, vision and inference in one cohort).

kwok runs no containers, so the benchmark keeps the jobs' work: each job needs W node-seconds,
gains one per Running pod per second, and pays each resize with the seconds a resize took on
real nodes (a checkpoint and the group again: --resize-cost, from benchmarks/results/
cluster-chaos-elastic_*); the benchmark deletes a job once its work is done. Meanwhile the
inference tenant takes its lent GPUs back now and then (a reclaim). Every second it reads what
each tenant's Running pods hold (never above its ClusterQueue's nominal quota plus borrowing
limit), what Kueue's status says each ClusterQueue holds (the same bound), the admitted
Workloads (within the cohort's GPUs), Kueue's PodsReadyTimeout evictions, and that every job is
done by the end (none starved). Work and GPUs held count by the clock, not by the sample: a
slow sample (the elastic run reads more) weighs what it lasted. It reports the GPUs held by
running pods over the run (GPU-hours used against those available), the makespan and the job
times.

    python benchmarks/elastic_churn.py [--jobs 24] [--seed 1] [--resize-cost 20] [--racks]
        [--pods-ready-timeout 15]

Needs root, the built control plane (make controlplane) and helm (make tools). Writes
benchmarks/results/elastic-churn_<hardware>_<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import environment, write_results

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' package: the design's cluster, as the tests start it
from tests.support.chart import expected_namespaces  # noqa: E402
from tests.support.devcluster import CHART, start, stop  # noqa: E402
from tests.support.devlab import DESIGN_VALUES, PODS_READY_TIMEOUT_S  # noqa: E402
from tests.support.specs import cluster_job  # noqa: E402

from gpufleet.cluster.elastic import quotas  # noqa: E402
from gpufleet.cluster.elastic_loop import one_round  # noqa: E402
from gpufleet.cluster.kinds import CLUSTER_QUEUES, WORKLOADS  # noqa: E402
from gpufleet.cluster.queues import quantity  # noqa: E402
from gpufleet.devcluster.kwok import RUN_FOR_A_DAY  # noqa: E402

GPUS_PER_NODE, GPU_NODES = 8, 15
TENANTS = ("llm", "vision")  # the training tenants; inference reclaims
RECLAIMER = "inference"
GPU = ("h100", "nvidia.com/gpu")


@dataclass
class Job:
    """One job of the stream and what became of it."""

    name: str
    tenant: str
    nodes: int
    work: float  # node-seconds
    arrives: float  # seconds after the start
    done: float = 0.0
    submitted: float | None = None
    started: float | None = None
    finished: float | None = None
    size: int = 0
    paused_until: float = 0.0
    resizes: int = 0
    sizes: list[int] = field(default_factory=list)


def stream(count: int, seed: int) -> list[Job]:
    """``count`` jobs: 2 to 4 nodes, 60 to 240 node-seconds of work, arriving over 3 minutes."""
    rng = random.Random(seed)
    return [Job(name=f"churn-{i:02d}", tenant=TENANTS[i % 2], nodes=rng.randint(2, 4),
                work=float(rng.randint(60, 240)), arrives=rng.uniform(0, 180))
            for i in range(count)]  # fmt: skip


def job_objects(job: Job, elastic: bool) -> list[dict[str, Any]]:
    """The rendered Indexed Job (elastic: minNodes 1), its pods kept Running by kwok."""
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    extra = {"minNodes": 1} if elastic else {}
    doc = cluster_job(nodes=job.nodes, procsPerNode=1, queue=job.tenant, volumes=[],
                      checkpoint={"dir": "s3://ckpt/churn"}, resources={"gpu": GPUS_PER_NODE},
                      **extra)  # fmt: skip
    doc["metadata"] = {"name": job.name, "namespace": job.tenant}
    objects = render(validate_training_job(doc), "job")
    template = objects[-1]["spec"]["template"]
    template["metadata"].setdefault("annotations", {}).update(RUN_FOR_A_DAY)
    return objects


# The inference tenant's jobs: 3 nodes, its whole nominal 24 GPUs, 8 of which it lends while
# idle: each takes them back from whoever borrows (Kueue's reclaimWithinCohort).
RECLAIMS = ((60.0, 60.0), (200.0, 60.0))  # (at, for) seconds after the start


def reclaim_job(index: int) -> Job:
    return Job(name=f"reclaim-{index}", tenant=RECLAIMER, nodes=3, work=0.0, arrives=0.0)


@dataclass
class Run:
    """One mode's run: its jobs, the GPU-seconds held, what went above quota."""

    elastic: bool
    jobs: list[Job]
    gpu_seconds: float = 0.0  # GPUs of Running pods, by the clock
    over_quota: list[str] = field(default_factory=list)  # tenants' Running pods
    status_over: list[str] = field(default_factory=list)  # Kueue's ClusterQueue status
    timeouts: set[str] = field(default_factory=set)  # PodsReadyTimeout evictions
    seconds: float = 0.0


def running_pods(cluster: Any, job: Job) -> int:
    pods = cluster.pods(job.tenant, job.name)
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp"))  # fmt: skip


def quota_problems(cluster: Any, run: Run, pods_hold: dict[str, int]) -> None:
    """Record each tenant whose Running pods (``pods_hold``: GPUs) exceed its ClusterQueue's
    nominal quota plus borrowing limit, each ClusterQueue whose status says so, the admitted
    Workloads (one list: one snapshot) holding more than the nodes have, and PodsReadyTimeout
    evictions. A slice that an admitted one replaces is not counted: Kueue marks it Finished an
    update later, and the new slice holds its pods too."""
    cqs = cluster.custom.list_cluster_custom_object(CLUSTER_QUEUES.group, CLUSTER_QUEUES.version,
                                                    CLUSTER_QUEUES.plural)["items"]  # fmt: skip
    for cq in cqs:
        name, q = cq["metadata"]["name"], quotas(cq).get(GPU)
        if q is None or q.borrowing_limit is None:
            continue
        if pods_hold.get(name, 0) > q.nominal + q.borrowing_limit:
            run.over_quota.append(f"{name}'s pods hold {pods_hold[name]}")
        if q.used > q.nominal + q.borrowing_limit:
            run.status_over.append(f"{name} holds {q.used}")
    workloads = cluster.custom.list_cluster_custom_object(WORKLOADS.group, WORKLOADS.version,
                                                          WORKLOADS.plural)["items"]  # fmt: skip
    held = [w for w in workloads if reserved(w)]
    replaced = {(w["metadata"].get("annotations") or {}).get(REPLACES) for w in held}
    total = sum(
        gpus_of(w)
        for w in held
        if f"{w['metadata']['namespace']}/{w['metadata']['name']}" not in replaced
    )
    if total > GPUS_PER_NODE * GPU_NODES:
        run.over_quota.append(f"admitted Workloads hold {total} GPUs")
    run.timeouts |= {
        f"{w['metadata']['name']}@{c.get('lastTransitionTime')}"
        for w in workloads
        for c in (w.get("status") or {}).get("conditions") or []
        if c.get("type") == "Evicted" and c.get("reason") == "PodsReadyTimeout"
    }


REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"  # <namespace>/<old slice>


def reserved(workload: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in workload.get("status", {}).get("conditions", [])}
    return conditions.get("QuotaReserved") == "True" and conditions.get("Finished") != "True"


def gpus_of(workload: dict[str, Any]) -> int:
    assignments = workload["status"].get("admission", {}).get("podSetAssignments") or []
    return sum(int(quantity(a.get("resourceUsage", {}).get(GPU[1], "0"))) for a in assignments)


def submit(cluster: Any, objects: list[dict[str, Any]], namespace: str) -> None:
    from gpufleet.cluster import Cluster

    Cluster(cluster.custom, cluster.core, namespace).submit(objects)


def parallelism(cluster: Any, job: Job) -> int:
    """The Job's size now (the controller's resizes change it)."""
    found = cluster.typed("BatchV1Api").read_namespaced_job(job.name, job.tenant)
    return int(found.spec.parallelism or 0)


def tick(cluster: Any, run: Run, now: float, elapsed: float, resize_cost: float) -> None:
    """The ``elapsed`` seconds since the last sample: each live job's work (a group trains only
    with all its pods Running, and not while a resize's checkpoint and restart take), its end,
    the GPUs held (by Running pods), the quota."""
    held, by_tenant = 0, {}
    for job in run.jobs:
        if job.submitted is None or job.finished is not None:
            continue
        running, size = running_pods(cluster, job), parallelism(cluster, job)
        held += running * GPUS_PER_NODE
        by_tenant[job.tenant] = by_tenant.get(job.tenant, 0) + running * GPUS_PER_NODE
        if running and job.started is None:
            job.started = now
        if size != job.size:
            if job.started is not None:  # a resize: checkpoint, the group again
                job.resizes += 1
                job.paused_until = now + resize_cost
            job.size = size
            job.sizes.append(size)
        if running == size and now >= job.paused_until:
            job.done += size * elapsed
        if job.done >= job.work:
            job.finished = now
            cluster.cancel(job.name, job.tenant)
    run.gpu_seconds += held * elapsed
    quota_problems(cluster, run, by_tenant)


def churn(cluster: Any, run: Run, resize_cost: float, limit: float) -> None:
    """Submit the stream on time, resize (elastic runs: the controller's rounds, here in this
    process), reclaim, and keep the work, every second, until every job is done."""
    begun = last = time.monotonic()
    reclaims = [(at, at + hold, reclaim_job(i)) for i, (at, hold) in enumerate(RECLAIMS)]
    while any(j.finished is None for j in run.jobs):
        now = time.monotonic() - begun
        if now > limit:
            raise SystemExit(f"not every job done after {limit:g} s: "
                             f"{[j.name for j in run.jobs if j.finished is None]}")  # fmt: skip
        for job in run.jobs:
            if job.submitted is None and now >= job.arrives:
                submit(cluster, job_objects(job, run.elastic), job.tenant)
                job.submitted = now
        for at, until, reclaimer in reclaims:
            if reclaimer.submitted is None and now >= at:
                submit(cluster, job_objects(reclaimer, False), RECLAIMER)
                reclaimer.submitted = now
            elif reclaimer.finished is None and now >= until:
                cluster.cancel(reclaimer.name, RECLAIMER)
                reclaimer.finished = now
        if run.elastic:
            one_round(cluster.custom)
        tick(cluster, run, now, time.monotonic() - last, resize_cost)
        last = time.monotonic()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - begun - now)))
    run.seconds = time.monotonic() - begun


def summary(run: Run) -> dict[str, Any]:
    capacity = GPUS_PER_NODE * GPU_NODES
    waits = [j.started - j.submitted for j in run.jobs if j.started is not None
             and j.submitted is not None]  # fmt: skip
    spans = [j.finished - j.submitted for j in run.jobs if j.finished is not None
             and j.submitted is not None]  # fmt: skip
    return {
        "mode": "elastic" if run.elastic else "fixed",
        "makespan_s": round(run.seconds, 1),
        "gpu_hours_used": round(run.gpu_seconds / 3600, 3),
        "utilization": round(run.gpu_seconds / (capacity * run.seconds), 4),
        "mean_wait_s": round(sum(waits) / len(waits), 1),
        "max_wait_s": round(max(waits), 1),
        "mean_completion_s": round(sum(spans) / len(spans), 1),
        "resizes": sum(j.resizes for j in run.jobs),
        "over_quota": run.over_quota,
        "status_over_quota": run.status_over,
        "pods_ready_timeouts": len(run.timeouts),
        "jobs": [{"name": j.name, "tenant": j.tenant, "nodes": j.nodes, "work": j.work,
                  "sizes": j.sizes, "resizes": j.resizes} for j in run.jobs],
    }  # fmt: skip


@contextmanager
def design(racks: bool, pods_ready_s: float) -> Iterator[Any]:
    """The design's cluster as the tests start it (tests/support/devlab.py), with its 15 GPU
    nodes (the tests' has 4 a flavor), and its chart; without its rack topology unless
    ``racks``: the controller grows no job in a topology-aware flavor (elastic.settled)."""
    with tempfile.TemporaryDirectory(prefix="elastic-churn-") as root:
        cluster = start(Path(root), nodes=GPU_NODES, gpus=GPUS_PER_NODE, values=DESIGN_VALUES,
                        without=("mpi-operator",),
                        extra=("--pods-ready-timeout", f"{pods_ready_s:g}s"))  # fmt: skip
        try:
            for namespace in expected_namespaces(DESIGN_VALUES):
                cluster.ensure_namespace(namespace)
            cluster.helm(
                "install",
                "onprem",
                str(CHART),
                "-f",
                str(DESIGN_VALUES),
                "-n",
                "gpufleet-system",
                "--create-namespace",
                "--wait",
                "--timeout",
                "180s",
                *(() if racks else ("--set", "kueue.topology.enabled=false")),
            )
            yield cluster
        finally:
            stop(cluster)


def seen(results: list[dict[str, Any]], key: str, what: str) -> str:
    """``what`` each mode saw at any sample under ``key``, or that none did."""
    found = {r["mode"]: sorted(set(r[key])) for r in results if r[key]}
    if not found:
        return f"no {what} at any sample"
    return f"{what}: " + "; ".join(f"{mode}: {', '.join(v)}" for mode, v in found.items())


def write(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    fixed, elastic = sorted(results, key=lambda r: r["mode"] == "elastic")
    lines = [
        "# Elastic jobs under churn: the 50-node design on kwok",
        "",
        f"`python benchmarks/elastic_churn.py --jobs {args.jobs} --seed {args.seed} "
        f"--resize-cost {args.resize_cost:g}{' --racks' if args.racks else ''} "
        f"--pods-ready-timeout {args.pods_ready_timeout:g}`: "
        f"{'the design with' if args.racks else 'the design without'} its rack topology; "
        f"{args.jobs} jobs of 2 to 4 nodes x 8 GPUs "
        f"(tenants llm and vision), the same stream twice: at their fixed size, and elastic "
        f"(minNodes 1, gpufleet's elastic controller every second). The inference tenant "
        f"reclaims its lent GPUs twice. {GPU_NODES} kwok GPU nodes ({GPU_NODES * GPUS_PER_NODE} "
        f"GPUs); a resize costs {args.resize_cost:g} s of no progress.",
        "",
        "| mode | makespan (s) | GPU utilization | GPU-hours used | mean wait (s) | max wait (s) "
        "| mean completion (s) | resizes | PodsReady timeouts | pods above quota "
        "| status above quota |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in (fixed, elastic):
        cells = [r["mode"], r["makespan_s"], f"{r['utilization']:.1%}", r["gpu_hours_used"],
                 r["mean_wait_s"], r["max_wait_s"], r["mean_completion_s"], r["resizes"],
                 r["pods_ready_timeouts"], len(r["over_quota"]),
                 len(r["status_over_quota"])]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    ratio = elastic["utilization"] / fixed["utilization"]
    lines += ["", f"Utilization elastic / fixed: **{ratio:.2f}**; every job done in both runs "
              f"(none starved); {seen(results, 'over_quota', 'tenants running pods above quota')}"
              f"; {seen(results, 'status_over_quota', 'Kueue status above quota')}.",
              ""]  # fmt: skip
    write_results("elastic-churn", lines, environment(), results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--resize-cost", type=float, default=20.0)
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds a run may take")
    parser.add_argument(
        "--pods-ready-timeout",
        type=float,
        default=PODS_READY_TIMEOUT_S,
        help="Kueue's waitForPodsReady timeout (s); the tests' value by default, which a "
        "2-core host under this churn overruns: a longer one keeps its evictions out",
    )
    parser.add_argument(
        "--racks",
        action="store_true",
        help="keep the design's rack topology (Kueue TAS): no job grows there",
    )
    args = parser.parse_args()
    results = []
    with design(args.racks, args.pods_ready_timeout) as cluster:
        for elastic in (False, True):
            run = Run(elastic, stream(args.jobs, args.seed))
            churn(cluster, run, args.resize_cost, args.limit)
            results.append(summary(run))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "jobs"}), flush=True)
    write(results, args)


if __name__ == "__main__":
    main()
