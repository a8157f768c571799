"""`gpufleet status`'s progress line, from the text two pods' launchers serve (made by the
runtime's own JobMetrics, as a pod's workers write them)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.cluster.progress import progress_line
from gpufleet.cluster.status import JobStatus
from gpufleet.launch.uploads import DurableCollector
from gpufleet.runtime.durable import UploadState
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


def uploader_text(tmp_path: Path, node: str, **state: Any) -> str:
    """What a pod's launcher serves for its uploader in ``state`` (its durable.json)."""
    registry = CollectorRegistry()
    path = tmp_path / f"{node}.json"
    path.write_text(json.dumps(UploadState(**state).to_json()))
    registry.register(DurableCollector(path, "digits"))
    return generate_latest(registry).decode()


def test_the_durable_tier_shows_the_step_every_node_reached_and_the_worst_lag(
    tmp_path: Path,
) -> None:
    now = time.time()
    a = uploader_text(tmp_path, "a", newest_fast=40, newest_durable=30,
                      pending_since=now - 125, failures=2)  # fmt: skip
    b = uploader_text(tmp_path, "b", newest_fast=40, newest_durable=20, failures=1)
    line = str(progress_line([pod_text(0, 40, total=100, checkpoint=40), a, b]))
    # 125 s is "2 min" (duration()); the least durable step, the worst lag, all failures
    assert line.endswith("last checkpoint at step 40, durable at step 20 (20 steps behind, "
                         "2 min; 3 failed uploads)"), line  # fmt: skip
    caught_up = [pod_text(0, 40, total=100, checkpoint=40),
                 uploader_text(tmp_path, "c", newest_fast=40, newest_durable=40)]  # fmt: skip
    assert str(progress_line(caught_up)).endswith("durable at step 40")
    assert "durable" not in str(progress_line([pod_text(0, 40, total=100, checkpoint=40)]))


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
    from tests.support.scenarios import connect, kube_of

    kube = kube_of("running")
    for pod in kube.pods():
        ports = [{"name": "metrics", "containerPort": 9410}]
        pod["spec"] = {"containers": [{"name": "pytorch", "ports": ports}]}
    kube.metrics["digits-worker-0"] = pod_text(0, 40, total=100, checkpoint=30)
    status = connect(kube).status("digits")
    assert status.progress is not None and status.progress.startswith("progress: step 40/100")
    calls = kube.called("connect_get_namespaced_pod_proxy_with_path")
    assert len(calls) == 2 and all(c["_request_timeout"] == 5 for c in calls)


ATTEMPT = """
import os, sys, time
from gpufleet.runtime.metrics import JobMetrics
from gpufleet.runtime.watchdog import HangWatchdog
rank, resume, hang = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
metrics = JobMetrics("digits", rank, hang_timeout=0.3, total_steps=100)
if resume:
    metrics.record_resume(resume)
watchdog = HangWatchdog(0.3, rank=rank, on_fire=metrics.record_hang).start()
for step in range(resume + 1, (hang or 40) + 1):
    metrics.record_step(step, 0.5, 0.0, 32)
    watchdog.beat(step)
time.sleep(5 if hang else 0)  # no step: the watchdog ends this process (exit 3)
"""


def test_a_hang_and_the_resume_after_it_are_in_the_status_line(tmp_path: Path) -> None:
    """Each attempt's worker is a process of its own (multiprocess metrics, as under a pod's
    launcher): the first one's watchdog fires after step 12 and the process ends; what it
    recorded still reaches `status` beside the next attempt's resume."""
    import subprocess
    import sys

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for restart, resume, hang in ((0, 0, 12), (1, 10, 0)):
        env["TORCHELASTIC_RESTART_COUNT"] = str(restart)
        done = subprocess.run([sys.executable, "-c", ATTEMPT, "0", str(resume), str(hang)],
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == (3 if hang else 0), done.stderr[-2000:]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    line = progress_line([generate_latest(registry).decode()])
    assert line is not None and line.startswith("progress: step 40/100 (40 %)"), line
    assert line.endswith("; restarted: 1 worker restart, rank 0 hung after step 12 (no step "
                         "within hangTimeout 0.3 s), resumed from step 10"), line  # fmt: skip


def test_a_job_that_never_restarted_says_nothing_of_restarts() -> None:
    assert "restarted" not in (progress_line([pod_text(0, 3, total=10, checkpoint=2)]) or "")
