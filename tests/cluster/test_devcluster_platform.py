"""The platform's chart and the API server's own checks on the real controllers (issue 11): the
chart installed with every ci/ values file, accepted by Kueue and uninstalled clean;
contradictory values refused before anything is applied; the longest name each target takes
runs and one more is refused; a field the server does not know is refused, not dropped.

All on the session's local cluster (tests/support/devcluster.py: 3 nodes x 4 A30). Queued jobs on
the lab's queues: test_devcluster_queues.py; tenancy and security: test_devcluster_tenancy.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import expected_namespaces
from tests.support.devcluster import CHART, DevCluster, needs_controlplane
from tests.support.devlab import KUEUE, active, namespaces, release_objects
from tests.support.procs import poll_until
from tests.support.specs import cluster_job, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


@pytest.fixture(autouse=True)
def without_the_lab() -> None:
    """These tests install the chart themselves, into the namespaces the lab's chart owns: a
    module using the shared ``lab`` that sorts before this one left it installed."""
    from tests.support.sharing import held_now

    assert "lab" not in held_now(), (
        "the lab's chart is installed: the modules using the `lab` fixture sort after "
        "test_devcluster_platform.py (tests/cluster/conftest.py)"
    )


def values_of(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


# Kueue v0.19's race (kubernetes-sigs/kueue#12572, fix proposed in #13186): a Topology deleted
# while a ResourceFlavor still names it keeps its finalizer when Kueue checks it before its cache
# has seen that flavor go, and nothing checks it again. helm then waits on it in vain.
TOPOLOGY_RACE = re.compile(r"resource Topology//(\S+) still exists\. status: Terminating")


FIRST_WAIT = "30s"  # helm's: an uninstall takes seconds here, Kueue's race holds it for good
WAITED = re.compile(r"still exists|timed out|deadline exceeded")  # helm's wait ran out


def uninstall(cluster: DevCluster, release: str, ns: str, *, check: bool) -> None:
    """`helm uninstall --wait` for FIRST_WAIT; when that wait runs out, what docs/cluster.md's chart
    section tells an operator to do about Kueue's race (annotate each Topology it holds: an
    update, so Kueue checks it again), then a longer wait for every object of the release, as
    a slow machine needs too."""
    done = cluster.helm("uninstall", release, "-n", ns, "--wait", "--timeout", FIRST_WAIT,
                        check=False)  # fmt: skip
    stuck = TOPOLOGY_RACE.findall(done.stderr)
    if done.returncode != 0 and WAITED.search(done.stderr):
        for name in stuck:
            patch = {"metadata": {"annotations": {"gpufleet.dev/recheck": "1"}}}
            cluster.custom.patch_cluster_custom_object(*KUEUE, "topologies", name, patch)
        poll_until(lambda: not release_objects(cluster, release), timeout=120,
                   what=f"the release's objects gone (Topologies {stuck} rechecked)")  # fmt: skip
        # and the release's record, whether or not helm dropped it with its error
        cluster.helm("uninstall", release, "-n", ns, "--ignore-not-found", "--wait")
    elif check:
        assert done.returncode == 0, f"helm uninstall {release}: {done.stderr[-3000:]}"


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))
def test_chart_installs_is_accepted_by_kueue_and_uninstalls_clean(
    devcluster: DevCluster, values: Path
) -> None:
    release, ns = "gf-ci", "gpufleet-ci"
    for namespace in expected_namespaces(values):  # its Alertmanager's, its mirror's
        devcluster.ensure_namespace(namespace)
    installed = devcluster.helm("install", release, str(CHART), "-f", str(values), "-n", ns,
                                "--create-namespace", "--wait", "--timeout", "120s",
                                check=False)  # fmt: skip
    try:
        assert installed.returncode == 0, installed.stderr[-3000:]
        tenants = [t["name"] for t in values_of(values)["tenants"]]

        def queues_active() -> bool:
            cqs = devcluster.custom.list_cluster_custom_object(
                *KUEUE, "clusterqueues", label_selector=f"app.kubernetes.io/instance={release}"
            )["items"]
            ours = {q["metadata"]["name"]: active(q) for q in cqs}
            lqs = [devcluster.custom.get_namespaced_custom_object(*KUEUE, t, "localqueues", t)
                   for t in tenants]  # fmt: skip
            return len(ours) == len(tenants) and all(ours.values()) and all(map(active, lqs))

        poll_until(queues_active, what="every ClusterQueue and LocalQueue Active", timeout=60)
        rdma = {t["name"] for t in values_of(values)["tenants"] if t.get("rdma")}
        for tenant in tenants:
            labels = devcluster.core.read_namespace(tenant).metadata.labels
            # an RDMA tenant: the chart's policy holds it to restricted plus IPC_LOCK instead
            level = "privileged" if tenant in rdma else "restricted"
            assert labels["pod-security.kubernetes.io/enforce"] == level
            assert (labels.get("gpufleet.dev/rdma") == "true") == (tenant in rdma)
    finally:
        # Also after a failed install: helm keeps a failed release and what it had created,
        # which would break the next test's install.
        uninstall(devcluster, release, ns, check=installed.returncode == 0)
    devcluster.core.delete_namespace(ns)
    poll_until(lambda: not release_objects(devcluster, release) and not namespaces(devcluster, ns),
               timeout=120, interval=1,
               what="every object of the release (namespaces included) to be gone")  # fmt: skip


def test_contradictory_values_are_refused_before_anything_is_applied(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    values = values_of(CHART / "ci" / "lab-3node-a30-values.yaml")
    values["tenants"][0]["queue"]["flavors"][0]["name"] = "h100"  # no such flavor
    bad = tmp_path / "bad-values.yaml"
    bad.write_text(yaml.safe_dump(values))
    proc = devcluster.helm("install", "gf-bad", str(CHART), "-f", str(bad), "-n", "gf-bad",
                           check=False)  # fmt: skip
    assert proc.returncode != 0
    assert 'tenants[0].queue.flavors[0].name: flavor "h100" is not defined' in proc.stderr
    assert not release_objects(devcluster, "gf-bad")
    assert not namespaces(devcluster, "gf-bad", *(t["name"] for t in values["tenants"]))


# -- names the controllers derive (item 4) ------------------------------------------------------


@pytest.mark.parametrize("target", ["job", "jobset"])
def test_a_name_at_the_targets_limit_runs_and_one_more_is_refused(
    devcluster: DevCluster, target: str
) -> None:
    """The longest name `gpufleet validate --target` accepts runs on the real controllers (pods
    and hostnames valid); one character more is refused by validate with the limit, where before
    the JobSet webhook refused it after gpufleet had accepted it."""
    from kubernetes.client.exceptions import ApiException

    from gpufleet.render import render
    from gpufleet.render.checks import name_limit
    from gpufleet.spec import validate_training_job

    ns = f"names-{target}"
    if ns not in namespaces(devcluster, ns):
        devcluster.namespace(ns)
    limit = name_limit(target, 2)
    name = "n" * limit
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1}, checkpoint={"dir": "s3://b/c"},
                      volumes=[])  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": ns}
    path = write_spec(devcluster.root, doc, f"{target}-limit.yaml")
    assert devcluster.gpufleet("validate", str(path), "--target", target).returncode == 0
    submit = devcluster.gpufleet("submit", str(path), "--target", target)
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert devcluster.wait_phase(name, ns, "Succeeded", "Failed") == "Succeeded"
    assert len(devcluster.pods(ns, name)) == 2
    assert devcluster.cancel(name, ns)
    doc["metadata"]["name"] = name + "n"
    longer = write_spec(devcluster.root, doc, f"{target}-over.yaml")
    refused = devcluster.gpufleet("validate", str(longer), "--target", target)
    assert refused.returncode == 2 and f"use at most {limit} characters" in refused.stderr
    if target == "jobset":  # the webhook agrees: one more character is one too many
        at_limit = {**doc, "metadata": {"name": name, "namespace": ns}}
        (jobset,) = render(validate_training_job(at_limit), target)
        jobset["metadata"]["name"] = name + "n"
        with pytest.raises(ApiException) as webhook:
            devcluster.custom.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", jobset, dry_run="All"
            )
        message = json.loads(webhook.value.body)["message"]
        assert 'admission webhook "vjobset.kb.io" denied' in message
        assert "pod names generated for this JobSet will exceed 63 characters" in message


# -- bad input against the live server (item 3h) --------------------------------------------------


def test_a_field_the_server_does_not_know_is_refused_not_dropped(devcluster: DevCluster) -> None:
    """Submit uses strict field validation: a field the installed CRD lacks (TrainJob's
    runtimePatches on a Trainer older than v2.2.0, here a JobSet field from the future) fails
    the submit in one line instead of vanishing."""
    from gpufleet.cluster import Cluster, ClusterError
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    ns = "strict-fields"
    if ns not in namespaces(devcluster, ns):
        devcluster.namespace(ns)
    doc = cluster_job(nodes=1, procsPerNode=1, resources={"gpu": 1},
                      checkpoint={"dir": "s3://b/c"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "future", "namespace": ns}
    (jobset,) = render(validate_training_job(doc), "jobset")
    jobset["spec"]["runtimePatches"] = [{"manager": "gpufleet"}]
    with pytest.raises(ClusterError) as refused:
        Cluster(devcluster.custom, devcluster.core, ns).submit([jobset])
    assert 'unknown field "spec.runtimePatches"' in str(refused.value)
    assert "\n" not in str(refused.value)
