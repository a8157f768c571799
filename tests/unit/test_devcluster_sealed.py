"""Sealed Secrets in the local control plane (devcluster/addons/sealed.py): off unless asked,
and how its controller, which reads only the in-cluster configuration, is given a pod's
ServiceAccount files: a mount namespace of its own, run here for real (as root), that leaves the
host's /run as it was."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpufleet.devcluster import addons
from gpufleet.devcluster.addons.sealed import (
    SEALED_SECRETS,
    SERVICE_ACCOUNT_DIR,
    in_cluster_argv,
    in_cluster_env,
    service_account_dir,
    write_service_account,
)
from gpufleet.devcluster.lifecycle import port_names, preflight
from gpufleet.errors import UserInputError


def test_sealed_secrets_runs_only_when_asked_and_only_a_known_project_may_be_asked() -> None:
    assert SEALED_SECRETS not in preflight(())
    if os.geteuid() == 0:
        assert SEALED_SECRETS in preflight((), ("sealed-secrets",))
    else:  # its own mount namespace needs root
        with pytest.raises(UserInputError, match="--with: sealed-secrets needs root"):
            preflight((), ("sealed-secrets",))
    assert f"{SEALED_SECRETS.name}-health" in port_names()  # its ports are planned with the rest
    assert addons.OPTIONAL == ("sealed-secrets",)
    with pytest.raises(UserInputError) as raised:
        preflight((), ("kueue",))  # runs anyway: not an optional one
    assert "--with: unknown optional controller kueue; one of: sealed-secrets" in str(raised.value)


def test_the_controller_gets_a_pods_environment_not_a_kubeconfig() -> None:
    env = in_cluster_env("https://10.1.2.3:6443", "kube-system")
    assert env == {"KUBERNETES_SERVICE_HOST": "10.1.2.3", "KUBERNETES_SERVICE_PORT": "6443",
                   "POD_NAMESPACE": "kube-system"}  # fmt: skip


def test_the_service_account_files_are_a_pods_with_the_token_for_root_alone(
    tmp_path: Path,
) -> None:
    account = service_account_dir(SEALED_SECRETS, tmp_path)
    write_service_account(account, "tok3n", b"CA PEM", "kube-system")
    assert stat.S_IMODE(account.stat().st_mode) == 0o700
    assert stat.S_IMODE((account / "token").stat().st_mode) == 0o600
    files = {p.name: p.read_bytes() for p in account.iterdir()}
    assert files == {"token": b"tok3n", "ca.crt": b"CA PEM", "namespace": b"kube-system"}


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_the_process_reads_its_files_at_client_gos_path_and_the_host_never_sees_them(
    tmp_path: Path,
) -> None:
    """The real command line, with `cat` in the controller's place: it reads the files where
    rest.InClusterConfig does, read-only, in its own namespace, under its own pid (what
    `cluster down` stops); the host's mount table and /run stay as they were."""
    account = tmp_path / "account"
    write_service_account(account, "tok3n", b"CA PEM", "kube-system")
    run_secrets = Path("/run/secrets/kubernetes.io").exists()
    script = (f"cat {SERVICE_ACCOUNT_DIR}/token {SERVICE_ACCOUNT_DIR}/namespace; echo; "
              f"touch {SERVICE_ACCOUNT_DIR}/x 2>/dev/null || echo read-only; echo $$")  # fmt: skip
    proc = subprocess.Popen(in_cluster_argv(["sh", "-c", script], account),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.splitlines() == ["tok3nkube-system", "read-only", str(proc.pid)]
    # none of its mounts in this (the host's) namespace; others' come and go meanwhile
    assert "gpufleet-sa" not in Path("/proc/self/mountinfo").read_text()
    assert "/secrets/kubernetes.io" not in Path("/proc/self/mountinfo").read_text()
    assert Path("/run/secrets/kubernetes.io").exists() == run_secrets
    assert not (account / "x").exists()
