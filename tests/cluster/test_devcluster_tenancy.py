"""Tenancy and security on the real controllers (issue 11, items 3f-3h): a tenant's members may
do in their namespace what the client does, and nothing in another's; serving submitted by a
tenant's user lands on GPU nodes; every rendered pod passes Pod Security "restricted" and
others are refused (a PyTorchJob's Master among them); the namespace's ResourceQuota holds;
bad input against the live server is one line and leaves nothing.

All on the session's local cluster with the chart's lab (tests/support/devlab.py: tenants
research and product in cohort "lab", 3 nodes x 4 A30).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from gpufleet.devcluster.kwok import RUN_FOR_A_DAY
from gpufleet.kube import Obj
from tests.support.devcluster import CHART, DevCluster, needs_controlplane, tenant_user
from tests.support.devlab import queued_job
from tests.support.procs import poll_until
from tests.support.specs import cluster_job, pod_templates, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]


def every_client_object(ns: str) -> list[Obj]:
    """What gpufleet's client creates for a tenant: every training target (with a PodMonitor),
    the kept logs' reader pod, and every serving target, autoscaled by HPA and by KEDA."""
    from gpufleet.cluster.keptlogs import reader_pod
    from gpufleet.render import SERVING_TARGETS, TARGETS, render, render_spec
    from gpufleet.spec import validate_spec, validate_training_job

    objects = []
    for target in TARGETS:
        if target != "trainjob":
            doc = queued_job("every", ns, nodes=2, gpus=1, target=target,
                             metrics={"port": 9090, "podMonitor": True})  # fmt: skip
            objects += render(validate_training_job(doc), target)
    # A TrainJob cannot declare the metrics port (render/checks.py)
    objects += render(validate_training_job(queued_job("every", ns, nodes=2, gpus=1)), "trainjob")
    # `gpufleet logs` of a job whose pods are gone: a reader pod, created and deleted
    objects.append(reader_pod(next(o for o in objects if o["kind"] == "Job")))
    serving = yaml.safe_load((CHART.parents[2] / "examples" / "digits-serving.yaml").read_text())
    serving["metadata"]["namespace"] = ns
    for engine in ("hpa", "keda"):
        serving["spec"]["autoscaling"]["engine"] = engine
        for target in SERVING_TARGETS:
            doc = serving
            if target == "kserve":  # KServe serves from a PVC only and scales on in-flight
                # requests (render/serving.py kserve_errors)
                model = {"name": serving["spec"]["model"]["name"], "pvc": {"claimName": "models"}}
                scaling = {**serving["spec"]["autoscaling"], "metric": "inflight"}
                doc = {**serving, "spec": {**serving["spec"], "model": model,
                                           "autoscaling": scaling}}  # fmt: skip
            objects += render_spec(validate_spec(doc), target)
    return objects


def allowed(cluster: DevCluster, user: str, group: str, ns: str, verb: str, obj: Obj) -> bool:
    """RBAC's answer (a SubjectAccessReview) for ``user`` in ``group`` doing ``verb`` on
    ``obj``'s kind in ``ns``; it needs no CRD installed (PyTorchJob, InferenceService, ...)."""
    group_name = obj["apiVersion"].rpartition("/")[0]
    review = {
        "spec": {
            "user": user,
            "groups": [group, "system:authenticated"],
            "resourceAttributes": {"namespace": ns, "verb": verb, "group": group_name,
                                   "resource": obj["kind"].lower() + "s"},
        }
    }  # fmt: skip
    answer = cluster.typed("AuthorizationV1Api").create_subject_access_review(review)
    return bool(answer.status.allowed)


def test_a_tenant_member_may_do_what_the_client_does_in_its_namespace_only(lab: DevCluster) -> None:
    """Every kind the client creates, gets, lists and deletes (training targets, PodMonitor,
    serving with HPA or KEDA, KServe): allowed to research's members in research, refused in
    product; the other tenant's pods cannot be read."""
    kinds = {(o["apiVersion"], o["kind"]): o for o in every_client_object("research")}
    assert {k for _, k in kinds} >= {"Job", "JobSet", "PyTorchJob", "TFJob", "TrainJob", "MPIJob",
        "Pod", "PodMonitor", "Deployment", "Service", "PodDisruptionBudget",
        "HorizontalPodAutoscaler", "ScaledObject", "InferenceService"}  # fmt: skip
    missing = [f"{verb} {kind}" for (_, kind), obj in sorted(kinds.items())
               for verb in ("create", "get", "list", "delete")
               if not allowed(lab, "bob", "research", "research", verb, obj)]  # fmt: skip
    assert not missing, f"the gpufleet-user Role lacks: {missing}"
    leaks = [f"{verb} {kind}" for (_, kind), obj in sorted(kinds.items())
             for verb in ("create", "get", "delete")
             if allowed(lab, "bob", "research", "product", verb, obj)]  # fmt: skip
    assert not leaks, f"a research member may act in product: {leaks}"


def test_serving_submitted_by_a_tenant_user_lands_on_gpu_nodes(lab: DevCluster) -> None:
    """`gpufleet submit examples/digits-serving.yaml` as a member of product (a client
    certificate, not the admin): Deployment, Service, PDB and HPA created; its pods pass
    `restricted`, run on GPU nodes; cancel removes them."""
    env = tenant_user(lab, "carol", "product")
    doc = yaml.safe_load((CHART.parents[2] / "examples" / "digits-serving.yaml").read_text())
    doc["metadata"]["namespace"] = "product"
    submit = lab.gpufleet_as(env, "submit", str(write_spec(lab.root, doc, "serving.yaml")))
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert "HorizontalPodAutoscaler/digits" in submit.stdout + submit.stderr

    def running() -> list[dict[str, Any]]:
        pods = [p for p in lab.pods("product") if p["metadata"]["name"].startswith("digits-")]
        return [p for p in pods if p["status"].get("phase") == "Running"]

    pods = poll_until(running, what="the serving pods Running", timeout=90, interval=1)
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
    status = lab.gpufleet_as(env, "status", "digits", "-n", "product")
    assert status.returncode == 0 and "digits" in status.stdout, status.stderr
    cancel = lab.gpufleet_as(env, "cancel", "digits", "-n", "product")
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    apps = lab.typed("AppsV1Api")
    assert not [d for d in apps.list_namespaced_deployment("product").items
                if d.metadata.name == "digits"]  # fmt: skip


def restricted_violation() -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loose"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip


def test_every_rendered_pod_passes_restricted_and_others_are_refused(lab: DevCluster) -> None:
    """Every pod template gpufleet renders (all targets, serving included), created as a Pod in a
    tenant namespace that enforces `restricted`, is admitted (server dry run); a pod without the
    restricted settings and a privileged one are refused by the API server."""
    from kubernetes.client.exceptions import ApiException

    refused = []
    for obj in every_client_object("research"):
        if obj["kind"] == "TrainJob":  # its templates are patches onto the Trainer's runtime
            continue
        for i, template in enumerate(pod_templates(obj)):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"probe-{obj['kind'].lower()}-{i}"},
                   "spec": template["spec"]}  # fmt: skip
            try:
                lab.core.create_namespaced_pod("research", pod, dry_run="All")
            except ApiException as exc:
                refused.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.body[:300]}")
    assert not refused, refused
    with pytest.raises(ApiException) as loose:
        lab.core.create_namespaced_pod("research", restricted_violation(), dry_run="All")
    assert loose.value.status == 403
    assert 'violates PodSecurity "restricted' in json.loads(loose.value.body)["message"]
    privileged = restricted_violation()
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as priv:
        lab.core.create_namespaced_pod("research", privileged, dry_run="All")
    assert priv.value.status in (403, 422), priv.value.body


def test_a_pytorchjob_with_a_master_gets_its_workers_refused_by_restricted(lab: DevCluster) -> None:
    """Why gpufleet renders PyTorchJob Workers only: with a Master, the real training-operator
    adds its `init-pytorch` container (no securityContext) to every Worker, and `restricted`
    refuses those pods. `gpufleet status` says so in one line (the operator's FailedCreatePod
    event), instead of a job that waits forever."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    name, ns = "with-master", "research"
    (job,) = render(validate_training_job(queued_job(name, ns, nodes=2, gpus=1)), "pytorchjob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    replicas["Worker"]["replicas"] = 1
    replicas["Master"] = copy.deepcopy(replicas["Worker"])
    for spec in replicas.values():  # the Master keeps running (kwok would end it)
        meta = spec["template"].setdefault("metadata", {})
        meta["annotations"] = {**meta.get("annotations", {}), **RUN_FOR_A_DAY}
    Cluster(lab.custom, lab.core, ns).submit([job])
    try:

        def refusal() -> str:
            st = lab.gpufleet("status", name, "-n", ns)
            return st.stdout if "init-pytorch" in st.stdout else ""

        out = poll_until(refusal, what="status to report the refused Worker", timeout=60)
        line = next(ln for ln in out.splitlines() if "init-pytorch" in ln)
        assert "cannot create pods" in line and 'violates PodSecurity "restricted' in line, out
        pods = lab.pods(ns, name)
        assert [p["metadata"]["name"] for p in pods] == [f"{name}-master-0"], pods
    finally:
        assert lab.cancel(name, ns)
        poll_until(lambda: not lab.pods(ns, name), what="the pods gone", timeout=60)


def test_the_namespace_resource_quota_is_enforced(lab: DevCluster) -> None:
    """A pod asking for more GPUs than research's ResourceQuota (8) is refused by admission."""
    from kubernetes.client.exceptions import ApiException

    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    job = render(validate_training_job(queued_job("greedy", "research", nodes=1, gpus=1)), "job")
    template = next(pod_templates(job[-1]))
    spec = copy.deepcopy(template["spec"])
    spec["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "9"},
                                          "limits": {"nvidia.com/gpu": "9"}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy"}, "spec": spec}
    with pytest.raises(ApiException) as exceeded:
        lab.core.create_namespaced_pod("research", pod, dry_run="All")
    assert exceeded.value.status == 403
    assert "exceeded quota: gpufleet-quota" in json.loads(exceeded.value.body)["message"]


# -- bad input against the live server (item 3h) --------------------------------------------------


def test_bad_input_on_the_live_server_is_one_line_and_leaves_nothing(lab: DevCluster) -> None:
    """A missing LocalQueue (exit 2, nothing created), an object refused by admission after
    another was created (exit 1 with the server's reason; the first removed again), an expired
    client certificate (exit 1, unauthorized): one line each, no traceback."""
    import datetime

    from gpufleet.devcluster.pki import Pki, issue, write_kubeconfig
    from gpufleet.devcluster.state import State

    lost = queued_job("lost", "research", nodes=1, gpus=1)
    lost["spec"]["queue"] = "nope"
    r = lab.gpufleet("submit", str(write_spec(lab.root, lost, "lost.yaml")), "--target", "jobset")
    assert r.returncode == 2, r.stderr
    assert "no LocalQueue 'nope' in namespace research (queues there: research)" in r.stderr
    assert (
        "Traceback" not in r.stderr and lab.gpufleet("status", "lost", "-n", "research").returncode
    )

    ns = lab.namespace("no-jobs-allowed")
    quota = {"metadata": {"name": "no-jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}}
    lab.core.create_namespaced_resource_quota(ns, quota)
    poll_until(lambda: lab.core.read_namespaced_resource_quota("no-jobs", ns).status.hard,
               what="the quota to be counted", timeout=30)  # fmt: skip
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1},
                      checkpoint={"dir": "s3://b/c"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "refused", "namespace": ns}
    r = lab.gpufleet("submit", str(write_spec(lab.root, doc, "refused.yaml")))
    assert r.returncode == 1, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error")]
    assert len(error) == 1 and "exceeded quota: no-jobs" in error[0], r.stderr
    assert "removed again: Service/refused" in error[0]
    assert not lab.core.list_namespaced_service(ns).items

    pki = Pki(lab.dir / "pki")
    yesterday = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    issue(pki, "user-expired", "dave", ["research"], not_after=yesterday)
    state = State.read(lab.dir)
    assert state is not None
    config = write_kubeconfig(lab.root / "expired.kubeconfig", state.server, pki, "user-expired")
    r = lab.gpufleet_as(lab.env | {"KUBECONFIG": str(config)}, "status", "anything", "-n",
                        "research")  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "unauthorized (expired or unknown credentials" in r.stderr
    assert "Traceback" not in r.stderr
