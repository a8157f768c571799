"""`gpufleet doctor` against the local control plane (kwok nodes): every controller the
session's cluster runs is found running (its Lease, or its webhooks answering: no Deployments
here) with its CRDs, Kueue queues every target's kind, and what kwok nodes lack is said: no
device plugin (WARN), no cluster DNS (FAIL, exit 1). The cluster without its controllers:
tests/cluster/test_devcluster.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.cluster.doctor.requirements import CONTROLLERS, TARGET_NEEDS
from gpufleet.errors import EXIT_FAILED
from tests.support.devcluster import DevCluster, needs_controlplane

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]


def doctor(cluster: DevCluster, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """doctor -o json's exit code and its checks by name."""
    done = cluster.gpufleet("doctor", "-o", "json", *args)
    assert done.stdout, done.stderr[-2000:]
    return done.returncode, {c["check"]: c for c in json.loads(done.stdout)["checks"]}


def test_every_controller_is_found_running_and_kwoks_lack_of_dns_fails(
    devcluster: DevCluster,
) -> None:
    code, checks = doctor(devcluster, *(a for t in TARGET_NEEDS for a in ("--target", t)))
    assert code == EXIT_FAILED
    for c in CONTROLLERS:
        mine = {k: v for k, v in checks.items() if k.split()[0] == c.name}
        assert f"{c.name} CRDs" in mine and len(mine) >= 2, c.name
        assert all(v["status"] == "OK" for v in mine.values()), mine
    assert "leader Lease" in checks["kueue kueue-controller-manager"]["detail"]
    assert "webhooks answer" in checks["training-operator training-operator"]["detail"]
    assert checks["kueue integrations"]["status"] == "OK"
    assert checks["gpu nodes"]["status"] == "OK" and "NVIDIA-A30" in checks["gpu nodes"]["detail"]
    assert checks["device plugin"]["status"] == "WARN"
    assert checks["dns"]["status"] == "FAIL" and checks["dns"]["fix"]
    failed = [k for k, v in checks.items() if v["status"] == "FAIL"]
    assert failed == ["dns"], failed


def test_the_text_lines_say_status_check_and_fix(devcluster: DevCluster) -> None:
    done = devcluster.gpufleet("doctor", "--target", "jobset")
    lines = done.stdout.splitlines()
    assert "OK    jobset webhooks: answer (a JobSet created with dryRun)" in lines
    assert not any(line.startswith(("OK    kuberay", "OK    volcano")) for line in lines)
    dns = lines.index(next(line for line in lines if line.startswith("FAIL  dns:")))
    assert lines[dns + 1].startswith("      fix: install CoreDNS")
    assert done.returncode == EXIT_FAILED and "Traceback" not in done.stderr
