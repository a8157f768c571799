"""Installing gpufleet into an environment that already has torch and numpy (a team's own image,
docs/images.md) changes neither, nor anything else that was there: gpufleet's range for torch
(pyproject.toml) takes the torch it finds. Run against the torch of this interpreter: the pinned
one in `make test`, the floor and the newest in `make compat`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.launch.worker import worker_env, worker_module_args
from gpufleet.spec import TrainingJob
from tests.support.cli import cli_env
from tests.support.paths import REPO
from tests.support.specs import digits_job

pytestmark = pytest.mark.slow

UV = REPO / ".venv" / "bin" / "uv"  # make's venv carries it (constraints.txt); make compat uses it


def uv(*args: str | Path) -> str:
    done = subprocess.run([str(UV), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def freeze(python: Path) -> dict[str, str]:
    """name -> version of what ``python``'s environment has installed."""
    found = {}
    for line in uv("pip", "freeze", "--python", python).splitlines():
        if line.startswith("-e "):  # make's own editable gpufleet
            continue
        name, sep, version = line.partition("==")
        if not sep:  # a project installed from its files: "name @ file:///..."
            name, _, version = line.partition(" @ ")
        found[name.strip()] = version.strip()
    return found


@dataclass(frozen=True)
class Team:
    """A team's environment (torch and numpy at this interpreter's versions) before and after
    gpufleet, without extras, was installed into it."""

    python: Path
    before: dict[str, str]
    after: dict[str, str]


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Team:
    tmp = tmp_path_factory.mktemp("install")
    # The wheels come from uv's cache (offline: no registry): the team's at this environment's
    # versions, gpufleet's others pinned to them too; what the team had is left free, so that
    # a resolver that wanted another torch or numpy would install it (and fail the test).
    ours = freeze(Path(sys.executable))
    python = tmp / "team" / "bin" / "python"
    uv("venv", "-q", "--python", sys.executable, tmp / "team")
    wanted = [f"torch=={ours['torch']}", f"numpy=={ours['numpy']}"]
    uv("pip", "install", "-q", "--offline", "--python", python, *pinned(tmp, ours), *wanted)
    before = freeze(python)
    others = {k: v for k, v in ours.items() if k not in before}
    source = tmp / "gpufleet"  # the project's files, as its source distribution has them
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    uv("pip", "install", "-q", "--offline", "--python", python, *pinned(tmp, others), source)
    return Team(python, before, freeze(python))


def pinned(tmp: Path, versions: dict[str, str]) -> list[str]:
    """uv's option for a constraints file of ``versions`` (gpufleet itself left out, and what was
    installed from its files: Horovod's wheel, built here, is no registry's version)."""
    pins = tmp / f"pins-{len(versions)}.txt"
    pins.write_text("".join(f"{k}=={v}\n" for k, v in versions.items()
                            if k != "gpufleet" and "://" not in v))  # fmt: skip
    return ["-c", str(pins)]


# What only the extras bring (pyproject.toml; docs/images.md, "What each extra brings").
EXTRAS_ONLY = {"typer", "rich", "pygments", "scikit-learn", "scipy", "grpcio", "nvidia-ml-py"}


def test_installing_gpufleet_changes_no_package_the_environment_had(team: Team) -> None:
    assert {"torch", "numpy"} <= team.before.keys()
    assert {name: team.after.get(name) for name in team.before} == team.before
    assert "gpufleet" in team.after
    assert not EXTRAS_ONLY & team.after.keys()  # a worker's install: no extra


def test_a_worker_trains_on_the_install_without_extras(team: Team, tmp_path: Path) -> None:
    workload = {"name": "synthetic", "steps": 6, "logEvery": 2}
    checkpoint = {"dir": str(tmp_path / "ckpt"), "everySteps": 3}
    job = TrainingJob.model_validate(
        digits_job("lean", procsPerNode=1, workload=workload, checkpoint=checkpoint)
    )
    env = {**cli_env(), **worker_env(job, tmp_path / "run")}
    done = subprocess.run(
        [str(team.python), "-m", "gpufleet.launch.pod", "--standalone", "--nproc-per-node=1",
         *worker_module_args(job)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [p.name.split("-")[0] for p in (tmp_path / "ckpt").glob("step_*")]
    assert sorted(steps) == [
        "step_000000003", "step_000000006"]  # fmt: skip


def test_what_needs_an_extra_says_which_in_one_line(team: Team, tmp_path: Path) -> None:
    command = subprocess.run([str(team.python.parent / "gpufleet"), "version"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert command.returncode == 2 and command.stdout == ""
    assert (
        command.stderr == "gpufleet: typer: the command line needs: pip install 'gpufleet[cli]'\n"
    )
    digits = subprocess.run(
        [str(team.python), "-c", "from gpufleet.workloads.digits_data import digits_arrays\n"
         "try:\n    digits_arrays()\nexcept Exception as e:\n    print(e)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "- scikit-learn: the digits workload needs: pip install 'gpufleet[digits]'\n" in (
        digits.stdout
    )
