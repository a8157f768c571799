"""Every render target: strict schema validity, Pod Security "restricted", each target's own
structure (the matrix of node, process, resource and queue shapes), GPU and lost-node
tolerations, `readOnly`, elastic node ranges, and any cluster-ready spec drawn by hypothesis.
Specs a target cannot run and `gpufleet render`: test_render_refusals.py; what the pods
run (rendezvous, mpirun, the worker environment, the PodMonitor's port): test_render_launch.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import UserInputError
from gpufleet.kube import ANNOTATION_NODE_RANGE, KUEUE_ELASTIC_JOB
from gpufleet.render import FRAMEWORK_TARGETS, TARGETS, check_restricted, pod_specs_in, render
from gpufleet.render.checks import TRAINJOB_GRACE_PERIOD
from gpufleet.render.job import ELASTIC_LAST_CALL_S
from gpufleet.spec import validate_training_job
from tests.support.k8s_schemas import validate_strictly
from tests.support.paths import REPO
from tests.support.specs import cluster_job

GOLDEN = REPO / "tests" / "golden"


def assert_valid(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        validate_strictly(obj)
        for path, pod in pod_specs_in(obj):
            errors = check_restricted(pod, path)
            assert not errors, [str(e) for e in errors]
        labels = obj["metadata"]["labels"]
        assert labels["gpufleet.dev/job"] == obj["metadata"]["name"]
        assert labels["app.kubernetes.io/managed-by"] == "gpufleet"


MATRIX = [
    pytest.param({"nodes": n, "procsPerNode": p, "resources": r, **extra}, id=name)
    for n, p, r, extra, name in [
        (1, 1, {}, {}, "cpu-1x1"),
        (2, 2, {"cpu": "4", "memory": "8Gi"}, {}, "cpu-2x2"),
        (4, 8, {"gpu": 8, "cpu": "64", "memory": "512Gi"}, {"queue": "team-a"}, "gpu-4x8-queue"),
        (3, 1, {"gpu": 2}, {"queue": "q", "priority": "high"}, "gpu-3x1-priority"),
        (2, 1, {}, {"checkpoint": {"dir": "s3://bucket/ckpt"}, "volumes": []}, "s3-no-volumes"),
    ]
]


@pytest.mark.parametrize("spec", MATRIX)
def test_matrix_renders_valid_restricted_objects(spec: dict[str, Any]) -> None:
    job = validate_training_job(cluster_job(**spec))
    objects = render(job, "job")
    assert_valid(objects)
    service, indexed = objects
    assert indexed["spec"]["completions"] == job.spec.nodes
    pod = indexed["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert f"--nproc-per-node={job.spec.procs_per_node}" in command
    assert "--rdzv-endpoint=train-0.train:29400" in command
    assert pod["subdomain"] == service["metadata"]["name"] == "train"
    gpu = job.spec.resources.gpu
    limits = pod["containers"][0]["resources"].get("limits", {})
    assert limits.get("nvidia.com/gpu") == (str(gpu) if gpu else None)
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]) == bool(gpu)
    queued = indexed["metadata"]["labels"].get("kueue.x-k8s.io/queue-name")
    assert queued == job.spec.queue
    assert indexed["spec"].get("suspend", False) == bool(job.spec.queue)


@pytest.mark.parametrize("spec", MATRIX)
def test_matrix_jobset(spec: dict[str, Any]) -> None:
    job = validate_training_job(cluster_job(**spec))
    (jobset,) = render(job, "jobset")
    assert_valid([jobset])
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == job.spec.max_restarts
    child = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert child["completions"] == child["parallelism"] == job.spec.nodes
    command = child["template"]["spec"]["containers"][0]["command"]
    assert "--rdzv-endpoint=train-worker-0-0.train:29400" in command
    assert jobset["spec"].get("suspend", False) == bool(job.spec.queue)


def containers_of(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each pod's (first) container by the path of its pod spec."""
    return {path: pod["containers"][0] for path, pod in pod_specs_in(obj)}


def assert_queued(obj: dict[str, Any], job: Any, suspend: bool | None) -> None:
    labels = obj["metadata"]["labels"]
    assert labels.get("kueue.x-k8s.io/queue-name") == job.spec.queue
    assert labels.get("kueue.x-k8s.io/priority-class") == job.spec.priority
    assert bool(suspend) == bool(job.spec.queue)  # Kueue unsuspends what it admits


@pytest.mark.parametrize("spec", MATRIX)
def test_matrix_pytorchjob(spec: dict[str, Any]) -> None:
    job = validate_training_job(cluster_job(**spec))
    (ptj,) = render(job, "pytorchjob")
    assert_valid([ptj])
    replicas = ptj["spec"]["pytorchReplicaSpecs"]
    # Workers only: with a Master the operator adds an init container refused by "restricted"
    assert list(replicas) == ["Worker"] and replicas["Worker"]["replicas"] == job.spec.nodes
    assert ptj["spec"]["runPolicy"]["backoffLimit"] == job.spec.max_restarts
    assert ptj["spec"]["nprocPerNode"] == str(job.spec.procs_per_node)
    for container in containers_of(ptj).values():
        assert container["name"] == "pytorch"
        assert "--rdzv-endpoint=train-worker-0:29400" in container["command"]
        assert f"--nnodes={job.spec.nodes}" in container["command"]
    assert_queued(ptj, job, ptj["spec"]["runPolicy"].get("suspend"))


@pytest.mark.parametrize("spec", MATRIX)
def test_matrix_trainjob(spec: dict[str, Any]) -> None:
    job = validate_training_job(cluster_job(**spec))
    (tj,) = render(job, "trainjob")
    assert_valid([tj])
    trainer = tj["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (
        job.spec.nodes,
        job.spec.procs_per_node,
    )
    assert "--rdzv-endpoint=train-node-0-0.train:29400" in trainer["command"]
    gpu = job.spec.resources.gpu
    limits = trainer.get("resourcesPerNode", {}).get("limits", {})
    assert limits.get("nvidia.com/gpu") == (str(gpu) if gpu else None)
    (patch,) = tj["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} >= {"/dev/shm"}
    assert_queued(tj, job, tj["spec"].get("suspend"))


@pytest.mark.parametrize("spec", MATRIX)
def test_matrix_mpijob(spec: dict[str, Any]) -> None:
    job = validate_training_job(cluster_job(**spec))
    (mpi,) = render(job, "mpijob")
    assert_valid([mpi])
    replicas = mpi["spec"]["mpiReplicaSpecs"]
    assert replicas["Worker"]["replicas"] == job.spec.nodes
    launcher = replicas["Launcher"]["template"]["spec"]
    waited = launcher["containers"][0]["command"]
    # mpirun once the workers resolve and answer SSH (launch/mpi_launcher.py)
    assert waited[:5] == ["python", "-m", "gpufleet.launch.mpi_launcher", "--ssh-port=2222", "--"]
    command = waited[5:]
    assert command[:5] == ["mpirun", "-np", str(job.spec.nodes), "--map-by", "ppr:1:node"]
    assert "--rdzv-endpoint=train-worker-0.train:29400" in command
    assert "GPUFLEET_JOB_NAME" in command  # the worker environment is forwarded with -x
    assert (
        "resources" not in launcher["containers"][0] or not launcher["containers"][0]["resources"]
    )  # the launcher holds no GPU
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][:4] == ["python", "-m", "gpufleet.launch.mpi_worker", "/usr/sbin/sshd"]
    assert mpi["spec"]["runPolicy"]["backoffLimit"] == job.spec.max_restarts
    assert_queued(mpi, job, mpi["spec"]["runPolicy"].get("suspend"))


@pytest.mark.parametrize("spec", MATRIX)
def test_matrix_volcano(spec: dict[str, Any]) -> None:
    job = validate_training_job(cluster_job(**spec))
    (vcjob,) = render(job, "volcano")
    assert_valid([vcjob])
    s = vcjob["spec"]
    assert s["minAvailable"] == s["tasks"][0]["replicas"] == job.spec.nodes  # a gang
    assert s["schedulerName"] == "volcano" and s["maxRetry"] == (job.spec.max_restarts or 1)
    assert s["queue"] == (job.spec.queue or "default")
    assert s.get("priorityClassName") == job.spec.priority
    assert "kueue.x-k8s.io/queue-name" not in vcjob["metadata"]["labels"]
    # The svc plugin's NetworkPolicy would admit only the job's pods (no Prometheus scrape).
    assert "--disable-network-policy=true" in s["plugins"]["svc"]
    command = s["tasks"][0]["template"]["spec"]["containers"][0]["command"]
    assert "--rdzv-endpoint=train-worker-0.train:29400" in command


def test_volcano_without_restarts_ends_at_the_first_failure() -> None:
    """maxRestarts 0 must not become Volcano's default of 3 retries (its webhook replaces a
    maxRetry of 0): the first failed or evicted pod terminates the job."""
    (vcjob,) = render(validate_training_job(cluster_job(maxRestarts=0)), "volcano")
    assert_valid([vcjob])  # TerminateJob is one of the CRD's actions
    assert vcjob["spec"]["maxRetry"] != 0
    assert vcjob["spec"]["policies"] == [
        {"events": ["PodFailed", "PodEvicted"], "action": "TerminateJob"}
    ]
    (restarting,) = render(validate_training_job(cluster_job(maxRestarts=2)), "volcano")
    assert restarting["spec"]["maxRetry"] == 2
    assert restarting["spec"]["policies"][0]["action"] == "RestartJob"


@pytest.mark.parametrize("target", list(TARGETS))
def test_gpu_product_pins_gpu_pods(target: str) -> None:
    job = validate_training_job(
        cluster_job(target=target, resources={"gpu": 2, "gpuProduct": "NVIDIA-A30"}, procsPerNode=2)
    )
    (*_, obj) = render(job, target)
    # Not the pods that only coordinate: the MPI launcher, the Ray head (the driver).
    coordinators = {"launcher", "head"}
    gpu_pods = [pod for _, pod in pod_specs_in(obj)
                if not coordinators & set(pod["containers"][0]["name"].split("-"))]  # fmt: skip
    assert gpu_pods
    for pod in gpu_pods:
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A30"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize(("timeout", "seconds"), [(None, 30), ("90s", 90), (1.5, 2), (0, 0)])
def test_every_pod_leaves_a_lost_node_after_the_specs_node_loss_timeout(
    target: str, timeout: Any, seconds: int
) -> None:
    """Not Kubernetes' 300 s: a training job cannot step without the pod on a lost node."""
    extra = {} if timeout is None else {"nodeLossTimeout": timeout}
    job = validate_training_job(
        cluster_job(target=target, resources={"gpu": 2}, procsPerNode=2, **extra)
    )
    (*_, obj) = render(job, target)
    pods = [pod for _, pod in pod_specs_in(obj)]
    assert pods
    for pod in pods:  # the MPI launcher too: its loss ends the job as a worker's does
        lost = {t["key"]: t for t in pod["tolerations"] if t.get("effect") == "NoExecute"}
        assert set(lost) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
        assert all(t["operator"] == "Exists" for t in lost.values())
        assert {t["tolerationSeconds"] for t in lost.values()} == {seconds}
        if pod["containers"][0]["name"] == "ray-head":  # no GPUs: Ray's services, the driver
            continue
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]


def written_false(obj: Any, key: str, path: str = "") -> list[str]:
    """Paths where ``obj`` writes ``key: false``."""
    if isinstance(obj, dict):
        found = [f"{path}.{key}"] if obj.get(key) is False else []
        return found + [p for k, v in obj.items() for p in written_false(v, key, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in written_false(v, key, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("target", list(TARGETS))
def test_read_only_is_written_only_when_true(target: str) -> None:
    """Kubernetes' Go types omit `readOnly: false`: a controller that round-trips an object
    drops it, and where a field must not change (Kubeflow Trainer's rule on a TrainJob's
    runtime patch) Kueue's update was refused and the job never started."""
    writable = validate_training_job(
        cluster_job(
            target=target,
        )
    )
    data = {"name": "data", "mountPath": "/data", "claimName": "data", "readOnly": True}
    ckpt = {"name": "ckpt", "mountPath": "/ckpt", "claimName": "team-ckpt"}
    read_only = validate_training_job(cluster_job(target=target, volumes=[ckpt, data]))
    for obj in render(writable, target):
        assert not written_false(obj, "readOnly"), written_false(obj, "readOnly")
    text = str(render(read_only, target))
    assert "'readOnly': True" in text


@settings(max_examples=25, deadline=None)
@given(
    nodes=st.integers(1, 8),
    procs=st.integers(1, 8),
    gpu_per_proc=st.integers(0, 2),
    queue=st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)),
    grace=st.floats(0, 3600),
    async_ckpt=st.booleans(),
)
def test_any_cluster_ready_spec_renders_valid_objects(
    nodes: int, procs: int, gpu_per_proc: int, queue: str | None, grace: float, async_ckpt: bool
) -> None:
    spec: dict[str, Any] = {
        "nodes": nodes,
        "procsPerNode": procs,
        "resources": {"gpu": gpu_per_proc * procs},
        "preemption": {"gracePeriod": grace},
        "checkpoint": {"dir": "/ckpt/x", "async": async_ckpt},
    }
    if queue:
        spec["queue"] = queue
    job = validate_training_job(cluster_job(**spec))
    pytorch = FRAMEWORK_TARGETS["pytorch"]
    targets = [t for t in pytorch if t != "trainjob" or grace <= TRAINJOB_GRACE_PERIOD]
    assert_valid([obj for target in targets for obj in render(job, target)])
    tf = validate_training_job(cluster_job(target="tfjob", **spec))
    assert_valid([obj for t in FRAMEWORK_TARGETS["tensorflow"] for obj in render(tf, t)])
    if len(targets) < len(pytorch):  # a TrainJob's pods get the runtime's 30 s
        with pytest.raises(UserInputError) as refused:
            render(job, "trainjob")
        assert [e.path for e in refused.value.errors] == ["spec.preemption.gracePeriod"]


@pytest.mark.parametrize("target", ["job", "jobset", "pytorchjob"])
def test_an_elastic_node_range_renders_where_the_engine_has_one(target: str) -> None:
    """spec.minNodes: torchrun's --nnodes MIN:MAX in every pod, PyTorchJob's elasticPolicy; the
    Trainer resumes on whatever world size the group re-forms with (tests/chaos)."""
    job = validate_training_job(cluster_job(nodes=4, minNodes=2))
    objects = render(job, target)
    assert_valid(objects)
    commands = [c["command"] for o in objects for c in containers_of(o).values()]
    assert commands and all("--nnodes=2:4" in c for c in commands)
    if target == "pytorchjob":
        assert objects[0]["spec"]["elasticPolicy"] == {
            "minReplicas": 2,
            "maxReplicas": 4,
            "rdzvBackend": "c10d",
            "maxRestarts": 2,
        }
    fixed = render(validate_training_job(cluster_job(nodes=4, minNodes=4)), target)
    assert all("--nnodes=4" in c["command"] for o in fixed for c in containers_of(o).values())
    assert "elasticPolicy" not in fixed[0].get("spec", {})
    assert all(KUEUE_ELASTIC_JOB not in o["metadata"].get("annotations", {}) for o in objects)


def test_a_queued_node_range_is_one_of_kueues_elastic_jobs() -> None:
    """With spec.queue, the range is Kueue's to admit: the Job carries the elastic annotation
    from its creation (Kueue gates its pods then) and its range for gpufleet's elastic
    controller, at spec.nodes until the controller sets the size that fits."""
    objects = render(validate_training_job(cluster_job(nodes=4, minNodes=2, queue="q")), "job")
    assert_valid(objects)
    indexed = objects[-1]
    assert indexed["metadata"]["annotations"] == {KUEUE_ELASTIC_JOB: "true",
                                                  ANNOTATION_NODE_RANGE: "2:4"}  # fmt: skip
    assert indexed["spec"]["parallelism"] == indexed["spec"]["completions"] == 4
    assert indexed["spec"]["suspend"] is True
    (container,) = indexed["spec"]["template"]["spec"]["containers"]
    assert f"--rdzv-conf=last_call_timeout={ELASTIC_LAST_CALL_S}" in container["command"]
