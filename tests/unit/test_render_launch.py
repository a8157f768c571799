"""What the rendered pods run: the PodMonitor's port on every target's pods, torchrun's
rendezvous store hosted by the pod its endpoint names (no DNS needed) and waited for as long as
the rendezvous, mpirun's ssh connection attempts, and the one worker environment of local and
pod workers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpufleet.render import TARGETS, render
from gpufleet.spec import validate_training_job
from gpufleet.torchapi import ENV_SHUTDOWN_TIMEOUT
from tests.support.specs import cluster_job


@pytest.mark.parametrize("target", [t for t in TARGETS if t not in ("trainjob", "rayjob")])
def test_the_pod_monitor_finds_a_named_port_on_every_target(target: str) -> None:
    """spec.metrics.podMonitor: every pod the PodMonitor selects has a container port of the
    name it scrapes (PyTorchJob replaced the port list and lost it; a TrainJob cannot declare
    one and refuses the spec, above; a Ray job refuses it: Ray exports its own)."""
    from tests.support.specs import pod_templates

    doc = cluster_job(target=target, nodes=2, metrics={"port": 9090, "podMonitor": True})
    objects = render(validate_training_job(doc), target)
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    selected = [
        t
        for o in objects
        for t in pod_templates(o)
        if selector.items() <= (t.get("metadata", {}).get("labels") or {}).items()
    ]
    assert selected, "the PodMonitor selects no pod template"
    for template in selected:
        ports = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
        assert {"name": endpoint["port"], "containerPort": 9090} in ports, (target, ports)


def test_the_pod_named_by_the_rendezvous_endpoint_hosts_the_store_without_dns() -> None:
    """Every target's pod launcher sets torchrun's is_host itself: true on the pod whose
    hostname the endpoint names, false on the others, kept when given, untouched for an
    address (where torch needs no DNS). The other pods wait for pod 0's store as long as the
    rendezvous waits for its members (join_timeout, torch's 600 s unless given), not torch's
    60 s: a pod that replaces one while pod 0 is itself being replaced must not fail."""
    from gpufleet.launch.pod import rendezvous_conf

    assert rendezvous_conf("", "train-0.train:29400", "train-0") == "is_host=true"
    assert rendezvous_conf("", "train-0.train:29400", "train-1") == (
        "read_timeout=600,is_host=false"
    )
    assert rendezvous_conf("", "t-master-0:29400", "t-master-0") == "is_host=true"
    assert rendezvous_conf("join_timeout=90", "t-worker-0-0.t:29400", "t-worker-0-1") == (
        "join_timeout=90,read_timeout=90,is_host=false"
    )
    assert rendezvous_conf("read_timeout=5", "t-0.t:29400", "t-1") == (
        "read_timeout=5,is_host=false"
    )
    assert rendezvous_conf("is_host=1", "t-0.t:29400", "t-1") == "is_host=1"
    assert rendezvous_conf("", "127.0.0.1:29400", "anything") == ""
    assert rendezvous_conf("", "localhost:29400", "anything") == ""


def test_mpirun_keeps_the_operators_ssh_connection_attempts() -> None:
    """Our plm_rsh_args replaces the MPI operator's (-o ConnectionAttempts=10): keep it, or the
    launcher's first ssh can fail before the workers' sshd listens and burn a restart."""
    (mpijob,) = [o for o in render(validate_training_job(cluster_job(nodes=2)), "mpijob")]
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    command = launcher["containers"][0]["command"]
    rsh = command[command.index("plm_rsh_args") + 1]
    assert "-o ConnectionAttempts=10" in rsh and "-p 2222" in rsh


@pytest.mark.parametrize("metrics", [False, True], ids=["no-metrics", "metrics"])
def test_local_and_pod_workers_get_the_same_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: bool
) -> None:
    """One worker environment (gpufleet.launch.worker.worker_env): the pod's differs from
    `gpufleet run`'s only where the pod launcher serves the job metrics, and in torchrun's
    shutdown timeout (`gpufleet run` gives it to its agents' LaunchConfig)."""
    from gpufleet.launch import local
    from gpufleet.render import podspec

    run_dir = tmp_path.resolve()
    monkeypatch.setattr(podspec, "RUN_DIR", str(run_dir))  # the same run directory for both
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    extra: dict[str, Any] = {"metrics": {"port": 9400}} if metrics else {}
    doc = cluster_job(env={"FOO": "bar"}, onNonFinite="rollback", **extra)
    job = validate_training_job(doc)
    here, pod = local.worker_env(job, run_dir), podspec.worker_env(job)
    served = {"GPUFLEET_METRICS_PORT": "9400", "GPUFLEET_METRICS_ADDRESS": "0.0.0.0"}
    grace = {ENV_SHUTDOWN_TIMEOUT: str(math.ceil(job.spec.preemption.grace_period))}
    assert pod == {**here, **(served if metrics else {}), **grace}
    assert here["FOO"] == "bar" and here["OMP_NUM_THREADS"] == "1"
    assert here["GPUFLEET_ON_NON_FINITE"] == "rollback"
    assert (here.get("PROMETHEUS_MULTIPROC_DIR") == str(run_dir / "metrics")) is metrics
