"""Kueue preempting a running job on real pods (issue 29, item 1): research's job borrows
product's idle GPUs (8 = its 6 + 2 lent) and trains on both real nodes; product submits a job
that needs its GPUs back; Kueue evicts the borrower (reclaimWithinCohort). The kubelet sends
SIGTERM, both ranks checkpoint at the same step and their pods exit 75; the job is requeued
without spending maxRestarts, admitted again once product's job is done, resumes from that
checkpoint and ends with the weights of the same job run here without interruption. A JobSet
here; an Indexed Job's preemption is test_realnodes_elastic's (an elastic Job reclaimed the
same way, readmitted, no restart spent, the uninterrupted digest).

The timings (eviction to pods gone, readmission to the resumed first step, steps lost) are
recorded where $GPUFLEET_RECORD names a file (benchmarks/cluster_chaos.py)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.support.browser import chromium, dashboard, missing, screenshot
from tests.support.claims import shared_claim
from tests.support.devcluster import BoundPods, DevCluster, condition, workload_of
from tests.support.procs import poll_until
from tests.support.realnodes import (
    CLAIM,
    DIGEST,
    TENANT,
    checkpoints,
    digests_in_logs,
    jobset_status,
    kept_logs_once_pods_are_gone,
    log_time,
    real_job,
    record,
    submit,
)
from tests.support.references import LONG, WORKLOAD, local_digest

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip

LENDER_TENANT = "product"  # the chart's lab values: lends research 2 of its 6 GPUs
STEPS, EVERY = LONG
TARGET = "jobset"
PREEMPTED = re.compile(r"gpufleet: preempted at step (\d+)")
RESUMED = re.compile(r"gpufleet: resumed from step (\d+)")


@pytest.fixture(scope="module")
def lender_claim(reallab: DevCluster) -> Iterator[str]:
    """product's own claim for its job's checkpoints."""
    shared_claim(reallab, CLAIM, namespace=LENDER_TENANT)
    try:
        yield CLAIM
    finally:
        reallab.core.delete_namespaced_persistent_volume_claim(CLAIM, LENDER_TENANT)


def reclaim(cluster: DevCluster, lender: str) -> None:
    """product's job, 2 x 3 GPUs: 6, more than the 4 product has left while research borrows."""
    claim = real_job(lender, 2, 1)
    claim["metadata"]["namespace"] = claim["spec"]["queue"] = LENDER_TENANT
    claim["spec"]["resources"] = {"gpu": 3}
    submit(cluster, claim)


def evicted(cluster: DevCluster, name: str) -> float | None:
    """When Kueue evicted the job's Workload (its condition's time, a Unix time)."""
    return since(condition(workload_of(cluster, TENANT, name), "Evicted"))


def admitted_again(cluster: DevCluster, name: str) -> float | None:
    """When Kueue admitted the Workload again, once the eviction is over."""
    wl = workload_of(cluster, TENANT, name)
    return None if condition(wl, "Evicted") else since(condition(wl, "Admitted"))


def since(cond: dict[str, Any] | None) -> float | None:
    if cond is None:
        return None
    return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00")).timestamp()


def restarts_spent(cluster: DevCluster, name: str) -> int:
    """What the JobSet's controller counted against spec.maxRestarts: its restarts that count
    towards its maximum (a free restart, its rule for exit 75, counts in status.restarts only;
    it happens when a child Job sees its pods exit 75 before the suspension reaches it)."""
    return int(jobset_status(cluster, name).get("restartsCountTowardsMax") or 0)


def exit_codes(pods: dict[str, dict[str, Any]]) -> dict[str, list[int]]:
    codes: dict[str, list[int]] = {}
    for name, pod in pods.items():
        for status in pod["status"].get("containerStatuses") or []:
            if "terminated" in status.get("state", {}):
                codes.setdefault(name, []).append(status["state"]["terminated"]["exitCode"])
    return codes


def ended(pods: dict[str, dict[str, Any]], first: set[str], logs: str) -> str:
    """Why a pod's exit code is not 75: each first pod's deletion and its container's end (a
    SIGKILL after the grace period, or the OOM killer, both exit 137), and the job's logs."""
    said = []
    for name in sorted(first):
        meta, status = pods[name]["metadata"], pods[name]["status"]
        ends = [s["state"].get("terminated") for s in status.get("containerStatuses") or []]
        said.append(f"{name}: deleted {meta.get('deletionTimestamp')} (grace "
                    f"{meta.get('deletionGracePeriodSeconds')} s), ended {ends}")  # fmt: skip
    return "\n".join([*said, logs[-4000:]])


def test_a_borrower_preempted_by_kueue_resumes_with_the_uninterrupted_weights(
    reallab: DevCluster, lender_claim: str
) -> None:
    name, lender = f"borrower-{TARGET}", f"lender-{TARGET}"
    doc = real_job(name, 2, 1)
    doc["spec"].update(resources={"gpu": 4}, maxRestarts=1)  # both nodes' 4: 2 borrowed
    doc["spec"]["workload"] = {**WORKLOAD, "steps": STEPS, "logEvery": 100}
    doc["spec"]["checkpoint"]["everySteps"] = EVERY
    submit(reallab, doc, TARGET)
    with BoundPods(reallab, TENANT, name) as seen:
        poll_until(lambda: checkpoints(reallab, name), what="the borrower's first checkpoint",
                   timeout=300, interval=0.5)  # fmt: skip
        first = {p["metadata"]["name"] for p in reallab.pods(TENANT, name)}
        reclaim(reallab, lender)
        t_evicted = poll_until(lambda: evicted(reallab, name), what="Kueue to evict the borrower",
                               timeout=60, interval=0.2)  # fmt: skip
        poll_until(lambda: not first & {p["metadata"]["name"] for p in reallab.pods(TENANT, name)},
                   what="the borrower's pods gone", timeout=120, interval=0.2)  # fmt: skip
        t_gone = time.time()
        # the checkpoint taken at SIGTERM (later ones delete it: checkpoint.keep)
        last = checkpoints(reallab, name)[-1]
        shards = sorted(p.name for p in last.glob("*.distcp"))
        assert reallab.wait_phase(lender, LENDER_TENANT, "Succeeded", "Failed",
                                  timeout=300) == "Succeeded"  # fmt: skip
        t_admitted = poll_until(lambda: admitted_again(reallab, name),
                                what="the borrower admitted again", timeout=120)  # fmt: skip
        resumed_at = poll_until(lambda: log_time(reallab, RESUMED, name),
                                what="the borrower to resume", timeout=240)  # fmt: skip
        phase, _ = reallab.run_to_end(name, TENANT, timeout=600)
    logs = reallab.gpufleet("logs", name, "-n", TENANT).stdout
    assert phase == "Succeeded", logs[-3000:]
    # SIGTERM from the kubelet: both ranks stopped and their pods exited 75 (preempted, after
    # the checkpoint), which cost nothing of maxRestarts
    codes = exit_codes({n: p for n, p in seen.pods.items() if n in first})
    assert codes == {n: [75] for n in first}, ended(seen.pods, first, logs)
    assert restarts_spent(reallab, name) == 0
    local = local_digest(reallab.root, 2, 1, STEPS, EVERY)
    assert digests_in_logs(reallab, name) == [local]
    shown = the_page_shows_the_preemption(reallab, name)  # while its pods are there
    kept = kept_logs_once_pods_are_gone(reallab, name)
    (preempted,) = map(int, PREEMPTED.findall(kept))
    (resumed,) = map(int, RESUMED.findall(kept))
    assert resumed == preempted, kept[-3000:]  # no step lost beyond the SIGTERM checkpoint
    assert shown in (None, resumed)
    # both ranks saved their shard of it, at the same step
    assert last.name.startswith(f"step_{preempted:09d}-") and len(shards) == 2, (last, shards)
    # rank 0's two results: the preempted try's (its state at that step), then the final one
    assert re.search(rf"gpufleet: {preempted} steps; state digest", kept), kept[-3000:]
    assert len(DIGEST.findall(kept)) == 2 and local in DIGEST.findall(kept), kept[-3000:]
    record(
        f"kueue-preemption-{TARGET}",
        evicted_to_pods_gone_s=t_gone - t_evicted,
        readmitted_to_resumed_s=resumed_at - t_admitted,
        steps_lost=preempted - resumed,
        preempted_at_step=preempted,
        free_restarts=int(jobset_status(reallab, name).get("restarts") or 0),
    )
    for job, ns in ((name, TENANT), (lender, LENDER_TENANT)):
        assert reallab.cancel(job, ns)


def the_page_shows_the_preemption(cluster: DevCluster, name: str) -> int | None:
    """The ended job's page in Chromium (issue 53, item 5): Succeeded, its two ranks on the two
    real nodes, Kueue's preemption and its cause in the timeline, the resumed pods' loss curve
    with its points, and rank 0's log saying where it resumed: that step (None where Chromium
    is missing: `make tools` installs it)."""
    if missing() is not None:
        return None
    with chromium() as browser, dashboard("-n", TENANT, cwd=cluster.root,
                                          env=cluster.env) as url:  # fmt: skip
        page = browser.new_page()
        page.goto(f"{url}/jobs/{TENANT}/{name}")
        assert page.locator("#status .phase-Succeeded").count() == 1
        rows = page.locator("#pods tbody tr")
        ranks = {row.locator("td").nth(0).inner_text(): row.locator("td").nth(2).inner_text()
                 for row in rows.all()}  # fmt: skip
        assert sorted(ranks) == ["0", "1"] and len(set(ranks.values())) == 2, ranks
        timeline = page.locator("#timeline").inner_text()
        assert "Preempted" in timeline and "reclamation within the cohort" in timeline, timeline
        assert page.locator("g#loss-points use").count() > 0
        logs = "\n".join(page.locator("pre.log").all_inner_texts())
        resumed = RESUMED.search(logs)
        assert resumed, logs[-3000:]
        screenshot(page, "job-preempted")
    return int(resumed.group(1))
