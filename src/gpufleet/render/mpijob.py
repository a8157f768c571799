"""Target ``mpijob``: a Kubeflow MPIJob (kubeflow.org/v2beta1, MPI Operator), OpenMPI."""

from __future__ import annotations

from gpufleet.kube import Obj
from gpufleet.launch.worker import worker_module_args
from gpufleet.render.checks import refuse_env_from, require_cluster_ready
from gpufleet.render.jobparts import kubeflow_run_policy, queued_labels
from gpufleet.render.meta import metadata
from gpufleet.render.podspec import (
    WorkerPod,
    gpu_placement,
    pod_metadata,
    pod_spec,
    torchrun_command,
    worker_env,
)
from gpufleet.spec import TrainingJob

SSH_PORT = 2222  # sshd runs as the image's non-root user, so not on 22
SSH_DIR = "/home/gpufleet/.ssh"  # the operator mounts the job's SSH keys here
SSHD_CONFIG = "/etc/gpufleet/sshd_config"  # shipped in the image (docker/sshd_config)


def render_mpijob(job: TrainingJob) -> list[Obj]:
    """One MPIJob: a launcher whose ``mpirun`` starts the workers in the worker pods over SSH.

    Workers run sshd as the non-root user (port 2222, keys from the operator's Secret); the
    launcher runs ``mpirun`` with the worker environment forwarded (``-x``): one torchrun per
    pod, which meet on worker 0, ``<name>-worker-0.<name>``, with c10d, exactly as on the
    other targets; for a Horovod job, its script, one rank per process (spec.procsPerNode a
    pod), on Horovod's MPI controller. A failed mpirun fails the launcher, retried up to
    ``runPolicy.backoffLimit = spec.maxRestarts`` times; a preemption is retried but counted.
    """
    require_cluster_ready(job, "mpijob")
    s = job.spec
    rdzv = f"{job.metadata.name}-worker-0.{job.metadata.name}"
    refuse_env_from(job, "mpijob", "mpirun forwards variables by name (-x) to the ranks")
    # mpirun once every worker's name resolves and its sshd answers (launch/mpi_launcher.py)
    waited = ["python", "-m", "gpufleet.launch.mpi_launcher", f"--ssh-port={SSH_PORT}", "--"]
    launcher = pod_spec(job, WorkerPod(rdzv_host=rdzv, container_name="launcher",
                                       command=[*waited, *_mpirun(job, rdzv)],
                                       worker=False))  # fmt: skip
    launcher["containers"][0].pop("ports")
    # The launcher asks for no GPU, but a cluster of GPU nodes only (the 3-node lab) has no
    # node without the GPU taint: tolerate it, or the launcher never schedules while its
    # workers hold their GPUs (seen with the real MPI operator on the local control plane).
    # No product selector: it may run on any node.
    if "tolerations" in (placement := gpu_placement(job.spec.resources)):
        launcher["tolerations"] = [*placement["tolerations"], *launcher["tolerations"]]
    worker = _worker(job, rdzv)
    for pod in (launcher, worker):
        pod["restartPolicy"] = "OnFailure"
    replicas = {"Launcher": (1, launcher, "launcher"), "Worker": (s.nodes, worker, "worker")}
    return [
        {
            "apiVersion": "kubeflow.org/v2beta1",
            "kind": "MPIJob",
            "metadata": metadata(job, queued_labels(job)),
            "spec": {
                "mpiImplementation": "OpenMPI",
                "launcherCreationPolicy": "WaitForWorkersReady",
                "slotsPerWorker": _ranks_per_pod(job),
                "sshAuthMountPath": SSH_DIR,
                "runPolicy": kubeflow_run_policy(job, "Running"),
                "mpiReplicaSpecs": {
                    role: {
                        "replicas": count,
                        "restartPolicy": "OnFailure",
                        "template": {"metadata": pod_metadata(job, kind), "spec": pod},
                    }
                    for role, (count, pod, kind) in replicas.items()
                },
            },
        }
    ]


def _ranks_per_pod(job: TrainingJob) -> int:
    """What mpirun starts in each worker pod: a torchrun (which starts spec.procsPerNode
    workers), or a Horovod job's ranks themselves."""
    return job.spec.procs_per_node if job.spec.framework == "horovod" else 1


def _mpirun(job: TrainingJob, rdzv: str) -> list[str]:
    """The launcher's mpirun: every worker pod's ranks over SSH, with the worker environment."""
    per_pod = _ranks_per_pod(job)
    forwarded = ["PATH", *sorted([*worker_env(job), *job.spec.env_refs])]
    if job.spec.framework == "horovod":  # the script under the worker shim, as a rank of MPI's
        ranks = ["python", "-u", *worker_module_args(job)]
    else:
        ranks = torchrun_command(job, WorkerPod(rdzv_host=rdzv))
    return [
        "mpirun",
        "-np",
        str(job.spec.nodes * per_pod),
        "--map-by",
        f"ppr:{per_pod}:node",
        "--bind-to",
        "none",
        "--mca",
        "plm_rsh_args",
        # This replaces the operator's OMPI_MCA_plm_rsh_args, so keep its ConnectionAttempts:
        # without it the first ssh may fail before the workers' sshd is up, burning a restart.
        f"-p {SSH_PORT} -o ConnectionAttempts=10 -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null",
        *[arg for var in forwarded for arg in ("-x", var)],
        *ranks,
    ]


def _worker(job: TrainingJob, rdzv: str) -> Obj:
    """A worker pod: sshd under a PID 1 that passes the kubelet's SIGTERM on to the processes
    mpirun started over SSH, so a preemption still checkpoints (launch/mpi_worker.py)."""
    command = ["python", "-m", "gpufleet.launch.mpi_worker", "/usr/sbin/sshd", "-De", "-f",
               SSHD_CONFIG]  # fmt: skip
    worker = pod_spec(job, WorkerPod(rdzv_host=rdzv, command=command))
    worker["containers"][0]["ports"].append({"name": "ssh", "containerPort": SSH_PORT})
    # Ready once sshd listens; with launcherCreationPolicy WaitForWorkersReady the operator
    # creates the launcher only then, but not for a job that starts suspended (Kueue's): the
    # launcher's own wait covers that (launch/mpi_launcher.py).
    worker["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2, "failureThreshold": 1,
    }  # fmt: skip
    return worker
