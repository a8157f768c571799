"""The 50-node on-premises design on the local control plane (`cluster up --values
ci/onprem-50node-values.yaml`, four kwok nodes per flavor, two in each of two racks), with the
chart and the same values, beside the session's cluster: its flavors and topology admit and
place a job; spec.topology keeps a job's workers in one rack, and one that fits no rack waits
saying so; Kueue's all-or-nothing admission (waitForPodsReady, here 15 s) evicts a job whose
pods cannot all start and frees its quota; tenant llm's RDMA jobs (the design's InfiniBand)
run there and are refused elsewhere."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpufleet.devcluster.kwok import RUN_FOR_A_DAY
from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.kube import MULTUS_NETWORKS
from gpufleet.render.podsecurity import RDMA_CAPABILITY
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from gpufleet.spec import DEFAULT_RDMA_RESOURCE
from tests.cluster.test_devcluster_queues import submit_annotated
from tests.support import ahead
from tests.support.browser import chromium, dashboard, needs_browser, screenshot
from tests.support.devcluster import DevCluster, needs_controlplane
from tests.support.devlab import DESIGN, DESIGN_VALUES, design_installed, queued_job
from tests.support.procs import poll_until
from tests.support.specs import cluster_job, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
VALUES = DESIGN_VALUES
# Where the design's Alertmanager runs and so its alert routing goes (monitoring.alerting).
ALERTMANAGER_NAMESPACE = yaml.safe_load(VALUES.read_text())["monitoring"]["alerting"]["namespace"]


@pytest.fixture(scope="module")
def design(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """The design's cluster and chart (tests/support/devlab.py): begun in the background when
    the session's cluster started (tests/cluster/conftest.py), else started here."""
    yield from ahead.take(DESIGN, lambda: design_installed(tmp_path_factory.mktemp("design")))


def test_the_alert_routing_is_in_the_alertmanagers_namespace(design: DevCluster) -> None:
    """The design's routing: a Secret for its Alertmanager's configSecret, in its namespace;
    the hook URLs read from the files of the Secrets the receivers name."""
    secret = design.core.read_namespaced_secret("onprem-alertmanager", ALERTMANAGER_NAMESPACE)
    config = yaml.safe_load(base64.b64decode(secret.data["alertmanager.yaml"]))
    assert {r["name"] for r in config["receivers"]} >= {"platform", "research", "oncall"}
    assert "api_url_file" in json.dumps(config)


def submit(cluster: DevCluster, name: str, target: str = "jobset", **spec: Any) -> None:
    doc = cluster_job(target, queue="llm", **spec)
    doc["metadata"] = {"name": name, "namespace": "llm"}
    path = write_spec(cluster.root, doc, f"{name}.yaml")
    done = cluster.gpufleet("submit", str(path), "--target", target)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_50_node_designs_flavors_and_topology_admit_and_place_a_job(
    design: DevCluster,
) -> None:
    """A queued 2 x 8-GPU JobSet of tenant llm is admitted by Kueue (flavor h100,
    topology-aware), placed on h100 nodes and Succeeds."""
    submit(design, "big", nodes=2, procsPerNode=8, resources={"gpu": 8},
           checkpoint={"dir": "s3://b/c"}, volumes=[])  # fmt: skip
    assert design.wait_phase("big", "llm", "Succeeded", "Failed", timeout=180) == "Succeeded"
    pods = design.pods("llm", "big")
    assert len(pods) == 2
    assert {p["spec"]["nodeName"].rsplit("-", 1)[0] for p in pods} == {"h100-node"}
    (workload,) = [w for w in design.workloads("llm") if "big" in w["metadata"]["name"]]
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"]["nvidia.com/gpu"] == "h100"
    assert design.cancel("big", "llm")


def gpus_reserved(cluster: DevCluster, queue: str) -> int:
    """nvidia.com/gpu reserved in ClusterQueue ``queue`` (every flavor)."""
    cq = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues",
                                                  queue)  # fmt: skip
    return sum(int(r.get("total", "0")) for f in cq["status"].get("flavorsReservation") or []
               for r in f["resources"] if r["name"] == "nvidia.com/gpu")  # fmt: skip


def test_a_job_whose_pods_cannot_all_start_is_evicted_and_its_quota_freed(
    design: DevCluster,
) -> None:
    """Its pods mount a claim that does not exist (what Kueue's quota cannot see): admitted,
    they stay Pending; after the pods-ready timeout Kueue evicts the workload, its GPUs are
    free for others, and `gpufleet status` says so and when it queues again."""
    submit(design, "stuck", nodes=1, procsPerNode=8, resources={"gpu": 8})  # claim team-ckpt
    poll_until(lambda: gpus_reserved(design, "llm") == 8, what="stuck admitted", timeout=120)

    def evicted() -> dict[str, Any] | None:
        (w,) = [w for w in design.workloads("llm") if "stuck" in w["metadata"]["name"]]
        conditions = {c["type"]: c for c in w.get("status", {}).get("conditions") or []}
        gone = conditions.get("Evicted", {}).get("reason") == "PodsReadyTimeout"
        return w if gone and not w["status"].get("admission") else None

    workload = poll_until(evicted, what="eviction after the pods-ready timeout", timeout=120)
    assert workload["status"]["requeueState"]["count"] == 1
    # the ClusterQueue's status follows (Kueue updates it in batches)
    poll_until(lambda: gpus_reserved(design, "llm") == 0, what="its GPUs freed", timeout=60)
    status = design.gpufleet("status", "stuck", "-n", "llm")
    assert "Kueue: evicted (PodsReadyTimeout)" in status.stdout, status.stdout
    assert "its quota freed, queued again at" in status.stdout
    assert design.cancel("stuck", "llm")


RACK = "topology.gpufleet.dev/rack"


def test_a_job_asking_for_one_rack_gets_one_and_one_too_wide_waits_saying_why(
    design: DevCluster,
) -> None:
    """spec.topology {level: rack}: 2 nodes x 8 GPUs land in one rack (each rack has two such
    nodes); 3 x 8 fit in no rack, and `gpufleet status` gives Kueue's reason."""
    one_rack = {"checkpoint": {"dir": "s3://b/c"}, "volumes": [], "topology": {"level": RACK}}
    submit(design, "near", nodes=2, procsPerNode=8, resources={"gpu": 8}, **one_rack)
    assert design.wait_phase("near", "llm", "Succeeded", "Failed", timeout=180) == "Succeeded"
    nodes = {p["spec"]["nodeName"] for p in design.pods("llm", "near")}
    racks = {design.core.read_node(n).metadata.labels[RACK] for n in nodes}
    assert len(nodes) == 2 and len(racks) == 1, (nodes, racks)
    assert design.cancel("near", "llm")
    submit(design, "wide", nodes=3, procsPerNode=8, resources={"gpu": 8}, **one_rack)

    def waiting() -> str | None:
        line = design.gpufleet("status", "wide", "-n", "llm").stdout
        return line if "topology" in line else None

    line = poll_until(waiting, what="Kueue's reason for wide", timeout=60, interval=1)
    assert 'topology "racks" allows to fit only 2 out of 3 pod(s)' in line, line
    assert "is full" not in line, line  # its GPUs are free: only the racks are too small
    assert not design.pods("llm", "wide")
    assert design.cancel("wide", "llm")


@pytest.mark.parametrize("target", ["job", "pytorchjob", "tfjob", "trainjob", "rayjob"])
def test_every_kueue_target_waits_when_its_workers_fit_no_rack(
    design: DevCluster, target: str
) -> None:
    """The same too-wide job on the other targets Kueue queues: Kueue reads the topology
    request from each one's worker pod set."""
    # cluster_job's checkpoints on a volume (TensorFlow's and Ray's need a filesystem): the
    # claim does not exist, but no pod is created while the job waits for a rack
    spec = {"topology": {"level": RACK}}
    name = f"wide-{target}"
    submit(design, name, target, nodes=3, procsPerNode=8, resources={"gpu": 8}, **spec)

    def waiting() -> str | None:
        line = design.gpufleet("status", name, "-n", "llm").stdout
        return line if "topology" in line else None

    line = poll_until(waiting, what=f"Kueue's reason for {name}", timeout=60, interval=1)
    assert 'topology "racks" allows to fit only 2 out of 3 pod(s)' in line, line
    assert design.cancel(name, "llm")


H100 = "NVIDIA-H100-80GB-HBM3"  # the design's flavor h100's node label


@needs_browser
def test_the_dashboard_shows_the_designs_gpus_and_why_each_job_waits(design: DevCluster) -> None:
    """The design's values in Chromium (issue 53, item 5): llm runs a 2 x 8 job, and queues one
    too wide for any rack and one larger than its quota and all it may borrow (10 x 8 > 56 +
    16). The jobs page gives each waiting job Kueue's own reason; the queues page llm's quota on
    flavor h100 and its two waiting jobs; the fleet page the H100s by product and by tenant."""
    submit_annotated(design, queued_job("trains", "llm", nodes=2, gpus=8), "job", RUN_FOR_A_DAY)
    submit(design, "too-wide", nodes=3, procsPerNode=8, resources={"gpu": 8},
           topology={"level": RACK})  # fmt: skip
    submit(design, "too-big", nodes=10, procsPerNode=8, resources={"gpu": 8})
    from playwright.sync_api import expect

    try:
        with chromium() as browser, dashboard("--refresh", "1", cwd=design.root,
                                              env=design.env) as url:  # fmt: skip
            page = browser.new_page()
            page.goto(url)
            expect(reason(page, "too-wide")).to_contain_text('topology "racks" allows to fit only',
                                                       timeout=60_000)  # fmt: skip
            expect(reason(page, "too-big")).to_contain_text(  # its 80 GPUs, over 56 + 16
                "current podset request (80) > maximum capacity (72)", timeout=60_000)  # fmt: skip
            expect(page.locator('#jobs tr[data-name="llm/trains"] .phase-Running')).to_have_count(
                1, timeout=60_000)  # fmt: skip
            screenshot(page, "jobs-design")
            page.goto(f"{url}/queues")
            gpus = page.locator('[data-name="llm"] tr[data-resource="h100/nvidia.com/gpu"] td')
            # nominal used borrowed lendable, the limits; Kueue updates its usage in batches,
            # and the page updates itself
            expect(gpus).to_have_text(["h100", "nvidia.com/gpu", "56", "16", "0", "16", "16",
                                       "16"], timeout=60_000)  # fmt: skip
            waiting = page.locator("#waiting tbody tr").evaluate_all(
                "rows => rows.map(r => r.dataset.name)")  # fmt: skip
            assert sorted(waiting) == ["llm/too-big", "llm/too-wide"], waiting
            screenshot(page, "queues-design")
            page.goto(f"{url}/fleet")
            product = page.locator(f'#products tr[data-product="{H100}"] td').all_inner_texts()
            assert product[1:5] == ["4", "32", "16", "16"], product  # nodes GPUs allocated free
            held = page.locator(f'#tenants tr[data-tenant="llm/{H100}"] td').last
            assert held.inner_text() == "16"
            screenshot(page, "fleet-design")
    finally:
        for name in ("trains", "too-wide", "too-big"):
            design.cancel(name, "llm")


def reason(page: Any, job: str) -> Any:
    """The jobs page's reason cell of llm's ``job``."""
    return page.locator(f'#jobs tr[data-name="llm/{job}"] .reason')


RDMA = {"checkpoint": {"dir": "s3://b/c"}, "volumes": [], "rdma": {"network": "ib-net"}}


def test_an_rdma_job_runs_in_its_tenant_and_a_restricted_one_is_refused_before_submitting(
    design: DevCluster,
) -> None:
    """The design's tenant llm has `rdma: true` (its GPU nodes advertise RDMA devices): an
    RDMA job's workers, adding IPC_LOCK, are admitted there and Succeed; `validate -n vision`
    (a restricted tenant) refuses the same job in one line, before anything is submitted."""
    doc = cluster_job(queue="vision", nodes=2, procsPerNode=8, resources={"gpu": 8}, **RDMA)
    doc["metadata"] = {"name": "ib"}
    done = design.gpufleet("validate", str(write_spec(design.root, doc, "ib-vision.yaml")),
                           "--target", "jobset", "-n", "vision")  # fmt: skip
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    assert "spec.rdma: namespace vision enforces Pod Security 'restricted'" in done.stderr
    assert not design.pods("vision")
    submit(design, "ib", nodes=2, procsPerNode=8, resources={"gpu": 8}, **RDMA)
    assert design.wait_phase("ib", "llm", "Succeeded", "Failed", timeout=180) == "Succeeded"
    for pod in design.pods("llm", "ib"):
        assert pod["metadata"]["annotations"][MULTUS_NETWORKS] == "ib-net"
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"]["add"] == [RDMA_CAPABILITY]
    nad = design.custom.get_namespaced_custom_object(
        "k8s.cni.cncf.io", "v1", "llm", "network-attachment-definitions", "ib-net"
    )
    assert json.loads(nad["spec"]["config"])["type"] == "ipoib"
    assert design.cancel("ib", "llm")
    doctor = {c["check"]: c for c in json.loads(design.gpufleet("doctor", "-o", "json").stdout)
              ["checks"]}  # fmt: skip
    assert doctor["rdma"]["status"] == "OK" and "llm" in doctor["rdma"]["detail"]
    assert doctor["pod security"]["status"] == "OK", doctor["pod security"]


def pod_refusal(
    cluster: DevCluster, namespace: str, container: dict[str, Any], annotations: Any = None
) -> str:
    """Why the API server refuses a pod of ``container`` (dry run), or "" when it admits it."""
    from kubernetes.client.exceptions import ApiException

    meta = {"name": "probe", "annotations": annotations or {}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": {"securityContext": POD_SECURITY, "containers": [container]}}  # fmt: skip
    try:
        cluster.core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        return str(exc.body)
    return ""


def test_the_rdma_tenant_holds_pods_to_restricted_with_ipc_lock_beside_a_device(
    design: DevCluster,
) -> None:
    """Its namespace enforces Pod Security privileged, so the chart's ValidatingAdmissionPolicy
    is what refuses the rest: IPC_LOCK without an RDMA device, privilege escalation, any other
    capability; a restricted container with IPC_LOCK and a device is admitted."""
    device = {"limits": {DEFAULT_RDMA_RESOURCE: "1", "cpu": "1", "memory": "1Gi"},
              "requests": {DEFAULT_RDMA_RESOURCE: "1", "cpu": "1", "memory": "1Gi"}}  # fmt: skip

    def container(add: list[str], **extra: Any) -> dict[str, Any]:
        security = copy.deepcopy(CONTAINER_SECURITY)
        security["capabilities"]["add"] = add
        return {"name": "c", "image": "x", "resources": device,
                "securityContext": security | extra}  # fmt: skip

    assert pod_refusal(design, "llm", container([RDMA_CAPABILITY])) == ""
    no_device = container([RDMA_CAPABILITY])
    no_device["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    assert "IPC_LOCK in a container that requests an RDMA device" in pod_refusal(
        design, "llm", no_device
    )
    # (this API server refuses privileged containers itself: --allow-privileged=false)
    assert "privileged" in pod_refusal(
        design, "llm", container([], privileged=True, allowPrivilegeEscalation=True)
    )
    assert "allowPrivilegeEscalation must be false" in pod_refusal(
        design, "llm", container([], allowPrivilegeEscalation=True)
    )
    assert "capabilities may add only" in pod_refusal(design, "llm", container(["NET_ADMIN"]))
    spc = container([RDMA_CAPABILITY], seLinuxOptions={"type": "spc_t"})
    assert "SELinux options may set only a container type" in pod_refusal(design, "llm", spc)
    loose = container([RDMA_CAPABILITY], appArmorProfile={"type": "Unconfined"})
    assert "AppArmor may be only" in pod_refusal(design, "llm", loose)
    assert "runAsUser must not be 0" in pod_refusal(
        design, "llm", container([RDMA_CAPABILITY], runAsUser=0)
    )
    assert "PodSecurity" in pod_refusal(design, "vision", container([RDMA_CAPABILITY]))
    # another tenant's InfiniBand network is not its pods' to join, restricted tenants' included
    other = {MULTUS_NETWORKS: "llm/ib-net"}
    for ns in ("llm", "vision"):
        assert "Multus networks of other namespaces" in pod_refusal(
            design, ns, container([]), other
        )
