"""`gpufleet status`'s progress line, from the text two pods' launchers serve (made by the
runtime's own JobMetrics, as a pod's workers write them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.cluster.progress import progress_line
from gpufleet.cluster.status import JobStatus
from gpufleet.runtime.metrics import JobMetrics


def pod_text(rank: int, steps: int, *, total: int, checkpoint: int | None) -> str:
    """What one pod serves when its worker of ``rank`` has trained ``steps`` steps of 0.5 s on
    32 samples each (and committed a checkpoint at ``checkpoint``)."""
    registry = CollectorRegistry()
    metrics = JobMetrics("digits", rank, registry, total_steps=total)
    for step in range(1, steps + 1):
        metrics.record_step(step, 0.5, 0.0, 32)
    if checkpoint is not None:
        metrics.record_checkpoint(checkpoint, 1.0, 0.2)
    return generate_latest(registry).decode()


def test_rank_zero_says_how_far_how_fast_how_long_and_where_a_restart_resumes() -> None:
    texts = [pod_text(1, 40, total=100, checkpoint=None),  # pod 0 need not host rank 0
             pod_text(0, 40, total=100, checkpoint=30)]  # fmt: skip
    # 2 ranks x 40 steps x 32 samples over rank 0's 20 s of steps; 60 steps x 0.5 s to go
    assert progress_line(texts) == (
        "progress: step 40/100 (40 %), 128 samples/s, about 30 s to go, last checkpoint at step 30"
    )


def test_without_a_total_or_a_checkpoint_it_says_what_it_knows() -> None:
    line = progress_line([pod_text(0, 3, total=0, checkpoint=None)])
    assert line == "progress: step 3, 64 samples/s"


def test_no_rank_zero_step_yet_means_no_line() -> None:
    assert progress_line([]) is None
    assert progress_line([pod_text(1, 5, total=10, checkpoint=None)]) is None


def test_the_status_line_puts_progress_before_the_reasons() -> None:
    status = JobStatus(name="digits", kind="Job", phase="Running", pods={"Running": 2},
                       reasons=["a reason"], progress="progress: step 3")  # fmt: skip
    assert status.line() == "digits (Job): Running, pods 2/2 Running; progress: step 3; a reason"
    assert status.as_dict()["progress"] == "progress: step 3"


def test_status_reads_each_running_pods_metrics_port_through_the_api_servers_proxy() -> None:
    """Rank 0 lives in the worker pod here; the master pod's port does not answer (503), which
    leaves it out rather than failing `status`."""
    from tests.unit.test_cluster import connect, kube_of

    kube = kube_of("running")
    for pod in kube.pods():
        ports = [{"name": "metrics", "containerPort": 9410}]
        pod["spec"] = {"containers": [{"name": "pytorch", "ports": ports}]}
    kube.metrics["digits-worker-0"] = pod_text(0, 40, total=100, checkpoint=30)
    status = connect(kube).status("digits")
    assert status.progress is not None and status.progress.startswith("progress: step 40/100")
    calls = kube.called("connect_get_namespaced_pod_proxy_with_path")
    assert len(calls) == 2 and all(c["_request_timeout"] == 5 for c in calls)
