"""Elastic jobs on real nodes (issue 56, items 2 to 4): a queued job of range 1-2 nodes, in
exact mode, with the chart's elastic controller (a Deployment on a real node).

The test's own cohort matches the two nodes (4 "A30" each): research's queue 4 GPUs that may
borrow 4, product's 4 that it lends. The job starts at 1 while product's job holds the other
node (the controller sets the waiting job to the size that fits); it grows to 2 once that job
ends (torchrun's membership change: a checkpoint, then the group again at 2); product then
takes its node back (Kueue evicts the whole job: reclaimWithinCohort) and the job is readmitted
at 1 at once. It ends with the weights of one uninterrupted worker here, bit for bit, and
spends none of maxRestarts. The timings are recorded for benchmarks/cluster_chaos.py."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufleet.cluster.kinds import CLUSTER_QUEUES, LOCAL_QUEUES
from gpufleet.cluster.resizes import resizes
from gpufleet.devcluster import platform
from gpufleet.errors import ClusterError, UserInputError
from gpufleet.kube import ANNOTATION_RESIZES
from tests.support.attacks import impersonating
from tests.support.chart import CHART
from tests.support.claims import shared_claim
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.devcluster import DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import (
    CLAIM,
    TENANT,
    checkpoints,
    digests_in_logs,
    kept_logs_once_pods_are_gone,
    log_time,
    pod_log,
    project_image,
    real_job,
    record,
    submit,
)
from tests.support.specs import digits_job, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip

LENDER = "product"
QUEUE, COHORT = "elastic", "elastic-lab"
GPUS = 4  # a real node's
STEPS, EVERY = 3000, 100
WORKLOAD = {"name": "digits", "steps": STEPS, "batchSize": 32, "logEvery": 500}
EXACT = {"exactAcrossWorldSizes": True, "shards": 2}
RESUMED = re.compile(r"gpufleet: resumed from step (\d+)")
PREEMPTED = re.compile(r"gpufleet: preempted at step (\d+)")
RESIZED = re.compile(r"resuming with (\d+)")
TOLERATE = '[{"key":"nvidia.com/gpu","operator":"Exists"}]'


def queues(cluster: DevCluster) -> Iterator[None]:
    """research's and product's queues in a cohort of their own, as big as the nodes: the
    chart's lab CQs (their flavor and covered resources) with 4 GPUs each."""
    custom = cluster.custom
    made: list[tuple[str, str | None]] = []
    for tenant, limits in ((TENANT, {"borrowingLimit": GPUS}), (LENDER, {"lendingLimit": GPUS})):
        model = custom.get_cluster_custom_object(CLUSTER_QUEUES.group, CLUSTER_QUEUES.version,
                                                 CLUSTER_QUEUES.plural, tenant)  # fmt: skip
        spec = copy.deepcopy(model["spec"])
        spec["cohortName"] = COHORT
        for group in spec["resourceGroups"]:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    if res["name"] == "nvidia.com/gpu":
                        res.pop("borrowingLimit", None)
                        res.pop("lendingLimit", None)
                        res.update(nominalQuota=GPUS, **limits)
        name = f"{QUEUE}-{tenant}"
        custom.create_cluster_custom_object(CLUSTER_QUEUES.group, CLUSTER_QUEUES.version,
                                            CLUSTER_QUEUES.plural,
                                            {"apiVersion": model["apiVersion"], "kind":
                                             "ClusterQueue", "metadata": {"name": name},
                                             "spec": spec})  # fmt: skip
        made.append((name, None))
        custom.create_namespaced_custom_object(
            LOCAL_QUEUES.group, LOCAL_QUEUES.version, tenant, LOCAL_QUEUES.plural,
            {"apiVersion": model["apiVersion"], "kind": "LocalQueue",
             "metadata": {"name": QUEUE}, "spec": {"clusterQueue": name}})  # fmt: skip
        made.append((QUEUE, tenant))
    try:
        yield
    finally:
        for name, namespace in reversed(made):
            kind = LOCAL_QUEUES if namespace else CLUSTER_QUEUES
            args = (kind.group, kind.version, *([namespace] if namespace else []), kind.plural)
            delete = (custom.delete_namespaced_custom_object if namespace
                      else custom.delete_cluster_custom_object)  # fmt: skip
            delete(*args, name)


@pytest.fixture(scope="module")
def elastic_lab(reallab: DevCluster) -> Iterator[DevCluster]:
    """The queues above, product's checkpoint claim, and the chart's elastic controller
    (`helm upgrade --set elastic.enabled=true`, the project's image)."""
    repository, tag = project_image()[0].rsplit(":", 1)
    shared_claim(reallab, CLAIM, namespace=LENDER)
    sets = [
        "elastic.enabled=true",
        f"elastic.image.repository={repository}",
        f"elastic.image.tag={tag}",
        "elastic.image.pullPolicy=Never",
        "elastic.interval=1s",
    ]
    reallab.helm("upgrade", platform.RELEASE, str(CHART), "-n", platform.NAMESPACE,
                 "--reuse-values", *(a for s in sets for a in ("--set", s)),
                 "--set-json", f"elastic.tolerations={TOLERATE}", "--wait")  # fmt: skip
    made = queues(reallab)
    next(made)
    try:
        yield reallab
    finally:
        next(made, None)
        reallab.helm(
            "upgrade",
            platform.RELEASE,
            str(CHART),
            "-n",
            platform.NAMESPACE,
            "--reuse-values",
            "--set",
            "elastic.enabled=false",
        )
        reallab.core.delete_namespaced_persistent_volume_claim(CLAIM, LENDER)


def product_job(name: str, steps: int) -> dict[str, Any]:
    doc = real_job(name, 1, 1)
    doc["metadata"]["namespace"] = LENDER
    doc["spec"].update(queue=QUEUE, resources={"gpu": GPUS})
    doc["spec"]["workload"] = {**WORKLOAD, "steps": steps}
    return doc


def elastic_job(name: str) -> dict[str, Any]:
    doc = real_job(name, 2, 1)
    doc["spec"].update(queue=QUEUE, minNodes=1, resources={"gpu": GPUS}, parallelism=EXACT,
                       maxRestarts=1, workload=WORKLOAD)  # fmt: skip
    doc["spec"]["checkpoint"]["everySteps"] = EVERY
    return doc


def reference(root: Any) -> subprocess.Popen[str]:
    """The same job, one worker, here: exact mode gives every world size its weights."""
    doc = digits_job(
        "elastic-reference",
        workload=WORKLOAD,
        nodes=1,
        procsPerNode=1,
        parallelism=EXACT,
        checkpoint={"dir": str(root / "elastic-reference"), "everySteps": EVERY},
    )
    argv = gpufleet_cmd("run", str(write_spec(root, doc, "elastic-reference.yaml")), "-o", "json")
    return subprocess.Popen(["nice", "-n", "10", *argv], cwd=root, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def job(cluster: DevCluster, name: str) -> dict[str, Any]:
    return cluster.as_dict(cluster.typed("BatchV1Api").read_namespaced_job(name, TENANT))


def sized(cluster: DevCluster, name: str, size: int) -> bool:
    return job(cluster, name)["spec"].get("parallelism") == size


def at_world(cluster: DevCluster, name: str, world: int) -> float | None:
    """When the job's pods logged their resume at ``world`` workers (each resize's, once)."""
    return log_time(cluster, re.compile(rf"resuming with {world}\b"), name)


@pytest.fixture
def cancelled(elastic_lab: DevCluster) -> Iterator[DevCluster]:
    """The test's jobs cancelled whatever its outcome: one left running would hold a node's
    GPUs from the tests after it."""
    yield elastic_lab
    for name, namespace in (("holder", LENDER), ("elastic", TENANT), ("reclaimer", LENDER)):
        with contextlib.suppress(ClusterError, UserInputError):  # cancelled already: gone
            elastic_lab.cancel(name, namespace)


def test_an_elastic_job_grows_into_freed_quota_and_is_readmitted_smaller_with_exact_weights(
    cancelled: DevCluster,
) -> None:
    cluster, name = cancelled, "elastic"
    local = reference(cluster.root)
    try:
        submit(cluster, product_job("holder", 20 * STEPS))
        cluster.wait_phase("holder", LENDER, "Running", timeout=180)
        submit(cluster, elastic_job(name))
        # waiting at 2 while product holds a node: set to 1, the size that fits, and started
        poll_until(lambda: sized(cluster, name, 1), what="the job set to 1 node", timeout=60)
        poll_until(lambda: checkpoints(cluster, name), what="the job's first checkpoint",
                   timeout=300, interval=0.5)  # fmt: skip
        freed = time.time()
        assert cluster.cancel("holder", LENDER)
        poll_until(lambda: sized(cluster, name, 2), what="the job grown to 2", timeout=60)
        grown = poll_until(lambda: at_world(cluster, name, 2), what="the job at 2 workers",
                           timeout=240, interval=0.5)  # fmt: skip
        # pod 0's log (its container's every try): the stop at 1 worker and the start at 2
        before = "\n".join(
            pod_log(cluster, p["metadata"]["name"]) for p in cluster.pods(TENANT, name)
        )
        reclaimed = time.time()
        submit(cluster, product_job("reclaimer", 20 * STEPS))  # holds the node to the end
        poll_until(lambda: sized(cluster, name, 1), what="readmitted at 1", timeout=120,
                   interval=0.5)  # fmt: skip
        shrunk = poll_until(lambda: at_world(cluster, name, 1), timeout=240,
                            what="the job at 1 worker again", interval=0.5)  # fmt: skip
        phase, _ = cluster.run_to_end(name, TENANT, timeout=600)
        out, err = local.communicate(timeout=600)
    finally:
        local.kill()
    assert local.returncode == 0, err[-3000:]
    history = resizes(job(cluster, name))
    assert [(r["from"], r["to"]) for r in history] == [(2, 1), (1, 2), (2, 1)], history
    assert [r["cause"] for r in history] == [
        "admitted at the size that fits", f"quota freed in cohort {COHORT}",
        f"reclaimed by {QUEUE}-{LENDER}"]  # fmt: skip
    assert phase == "Succeeded"
    assert int(job(cluster, name)["status"].get("failed") or 0) == 0  # no restart spent
    expected = json.loads(out)["state_digest"]
    assert digests_in_logs(cluster, name) == [expected]  # the last try's: bit for bit
    kept = kept_logs_once_pods_are_gone(cluster, name)
    assert [int(w) for w in RESIZED.findall(kept)] == [2, 1], kept[-3000:]
    # each resize: a checkpoint at the stop, and the group again from that step (a membership
    # change starts the try's log files over: the stop at 1 worker is in the pod's log only)
    preempted = sorted(set(map(int, PREEMPTED.findall(before + kept))))
    resumed = sorted(set(map(int, RESUMED.findall(before + kept))))
    assert len(preempted) == 2 and resumed == preempted, (before + kept)[-3000:]
    record("elastic-grow-shrink", freed_to_first_step_at_2_s=grown - freed,
           reclaim_to_first_step_at_1_s=shrunk - reclaimed,
           steps_lost=sum(p - r for p, r in zip(preempted, resumed, strict=True)))  # fmt: skip


def test_the_controllers_account_may_change_an_elastic_jobs_size_and_nothing_else(
    elastic_lab: DevCluster,
) -> None:
    """As the chart's elastic controller (impersonated): an elastic Job's size within its range
    and its history pass the policy; a size outside the range, its pod template, its
    suspension, a Job without the elastic annotation, and what RBAC never gave (a Secret, a
    deletion) are refused."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    doc = elastic_job("probe")
    doc["spec"]["queue"] = "no-such-queue"  # Kueue leaves it suspended: nothing runs
    (_, probe) = render(validate_training_job(doc), "job")
    plain = copy.deepcopy(probe)
    plain["metadata"]["name"] = "probe-plain"
    del plain["metadata"]["annotations"]
    admin = client.BatchV1Api(elastic_lab.api)
    for obj in (probe, plain):
        admin.create_namespaced_job(TENANT, obj)
    controller = impersonating(elastic_lab, f"system:serviceaccount:{platform.NAMESPACE}:"
                               f"{platform.RELEASE}-elastic", "system:serviceaccounts")  # fmt: skip
    batch = client.BatchV1Api(controller)

    def refused(name: str, body: dict[str, Any]) -> str:
        with pytest.raises(ApiException) as info:
            batch.patch_namespaced_job(name, TENANT, body)
        return f"{info.value.status} {info.value.body}"

    try:
        size = {"spec": {"parallelism": 1, "completions": 1}}
        history = {"metadata": {"annotations": {ANNOTATION_RESIZES: "[]"}}}
        batch.patch_namespaced_job("probe", TENANT, {**size, **history})
        assert "within the Job's node range" in refused(
            "probe", {"spec": {"parallelism": 3, "completions": 3}})  # fmt: skip
        # what the API server lets a suspended Job change, and the policy does not
        template = {"spec": {"template": {"metadata": {"annotations": {"x": "y"}}}}}
        assert "changes only a Job's size" in refused("probe", template)
        assert "changes only a Job's size" in refused("probe", {"spec": {"suspend": False}})
        assert "only an elastic Job" in refused("probe-plain", size)
        with pytest.raises(ApiException) as forbidden:
            client.CoreV1Api(controller).read_namespaced_secret("any", TENANT)
        assert forbidden.value.status == 403
        with pytest.raises(ApiException) as forbidden:
            batch.delete_namespaced_job("probe", TENANT)
        assert forbidden.value.status == 403
    finally:
        for name in ("probe", "probe-plain"):
            admin.delete_namespaced_job(name, TENANT, propagation_policy="Background")
