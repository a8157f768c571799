"""Target ``mpijob``: a Kubeflow MPIJob (kubeflow.org/v2beta1, MPI Operator), OpenMPI."""

from __future__ import annotations

from gpufleet.kube import Obj
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
    """One MPIJob: a launcher whose ``mpirun`` starts one torchrun per worker pod over SSH.

    Workers run sshd as the non-root user (port 2222, keys from the operator's Secret); the
    launcher runs ``mpirun -np <nodes> --map-by ppr:1:node`` with the worker environment
    forwarded (``-x``). torchrun then meets on worker 0, ``<name>-worker-0.<name>``, with
    c10d, exactly as on the other targets. A failed mpirun fails the launcher, retried up to
    ``runPolicy.backoffLimit = spec.maxRestarts`` times; a preemption is retried but counted.
    """
    require_cluster_ready(job, "mpijob")
    name = job.metadata.name
    s = job.spec
    rdzv = f"{name}-worker-0.{name}"
    refuse_env_from(job, "mpijob", "mpirun forwards variables by name (-x) to the ranks")
    forwarded = ["PATH", *sorted([*worker_env(job), *job.spec.env_refs])]
    mpirun = [
        "mpirun",
        "-np",
        str(s.nodes),
        "--map-by",
        "ppr:1:node",
        "--bind-to",
        "none",
        "--mca",
        "plm_rsh_args",
        # This replaces the operator's OMPI_MCA_plm_rsh_args, so keep its ConnectionAttempts:
        # without it the first ssh may fail before the workers' sshd is up, burning a restart.
        f"-p {SSH_PORT} -o ConnectionAttempts=10 -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null",
        *[arg for var in forwarded for arg in ("-x", var)],
        *torchrun_command(job, WorkerPod(rdzv_host=rdzv)),
    ]
    # mpirun once every worker's name resolves and its sshd answers (launch/mpi_launcher.py)
    waited = ["python", "-m", "gpufleet.launch.mpi_launcher", f"--ssh-port={SSH_PORT}", "--"]
    launcher = pod_spec(job, WorkerPod(rdzv_host=rdzv, container_name="launcher",
                                       command=[*waited, *mpirun], worker=False))  # fmt: skip
    launcher["containers"][0].pop("ports")
    # The launcher asks for no GPU, but a cluster of GPU nodes only (the 3-node lab) has no
    # node without the GPU taint: tolerate it, or the launcher never schedules while its
    # workers hold their GPUs (seen with the real MPI operator on the local control plane).
    # No product selector: it may run on any node.
    if "tolerations" in (placement := gpu_placement(job.spec.resources)):
        launcher["tolerations"] = [*placement["tolerations"], *launcher["tolerations"]]
    worker = pod_spec(
        job,
        WorkerPod(
            rdzv_host=rdzv,
            # sshd under a PID 1 that passes the kubelet's SIGTERM on to the pod launcher
            # mpirun started over SSH, so a preemption still checkpoints (launch/mpi_worker.py)
            command=[
                "python",
                "-m",
                "gpufleet.launch.mpi_worker",
                "/usr/sbin/sshd",
                "-De",
                "-f",
                SSHD_CONFIG,
            ],
        ),
    )
    worker["containers"][0]["ports"].append({"name": "ssh", "containerPort": SSH_PORT})
    # Ready once sshd listens; with launcherCreationPolicy WaitForWorkersReady the operator
    # creates the launcher only then, but not for a job that starts suspended (Kueue's): the
    # launcher's own wait covers that (launch/mpi_launcher.py).
    worker["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2, "failureThreshold": 1,
    }  # fmt: skip
    for pod in (launcher, worker):
        pod["restartPolicy"] = "OnFailure"
    return [
        {
            "apiVersion": "kubeflow.org/v2beta1",
            "kind": "MPIJob",
            "metadata": metadata(job, queued_labels(job)),
            "spec": {
                "mpiImplementation": "OpenMPI",
                "launcherCreationPolicy": "WaitForWorkersReady",
                "slotsPerWorker": 1,
                "sshAuthMountPath": SSH_DIR,
                "runPolicy": kubeflow_run_policy(job, "Running"),
                "mpiReplicaSpecs": {
                    "Launcher": {
                        "replicas": 1,
                        "restartPolicy": "OnFailure",
                        "template": {
                            "metadata": pod_metadata(job, "launcher"),
                            "spec": launcher,
                        },
                    },
                    "Worker": {
                        "replicas": s.nodes,
                        "restartPolicy": "OnFailure",
                        "template": {
                            "metadata": pod_metadata(job, "worker"),
                            "spec": worker,
                        },
                    },
                },
            },
        }
    ]
