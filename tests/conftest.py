"""Shared fixtures: run the real CLI in a scratch directory and check for orphan processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import yaml
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# Property tests: `ci` (the default, `make test`) draws the same examples on every run, each
# test's seed derived from its name, so CI never fails at random; `explore` (`make fuzz`) draws
# new ones each run and keeps failures in .hypothesis/ to replay. Both print the failing example
# and the blob that reproduces it (@reproduce_failure).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def poll_until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 120,
    interval: float = 0.2,
    alive: subprocess.Popen[Any] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    Fails the test saying ``what`` was awaited when ``timeout`` seconds pass, or at once when
    the ``alive`` process has exited (a dead launcher makes no more progress; its exit code is
    in the message). Exceptions of the ``retry_on`` types count as "not yet" (a server that is
    not listening yet raises OSError).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except retry_on:
            value = None
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            pytest.fail(f"process exited with {alive.returncode} while waiting for {what}")
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def digits_job(name: str = "digits-test", **spec: Any) -> dict[str, Any]:
    """A small digits TrainingJob document; ``spec`` keys override (camelCase)."""
    doc: dict[str, Any] = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workload": {"name": "digits", "steps": 40, "batchSize": 32, "logEvery": 5},
            "nodes": 1,
            "procsPerNode": 2,
            "checkpoint": {"everySteps": 10, "keep": 3},
            "maxRestarts": 2,
            "hangTimeout": "60s",
            "preemption": {"gracePeriod": "20s"},
        },
    }
    doc["spec"].update(spec)
    return doc


def cluster_job(**spec: Any) -> dict[str, Any]:
    """A digits job named "train" that can run on a cluster (image, checkpoints on a volume)."""
    base: dict[str, Any] = {
        "image": "ghcr.io/example/gpufleet:0.1.0",
        "checkpoint": {"dir": "/ckpt/run", "everySteps": 50},
        "volumes": [{"name": "ckpt", "mountPath": "/ckpt", "claimName": "team-ckpt"}],
    }
    base.update(spec)
    return digits_job("train", **base)


def fill_disk(disk: Path) -> Path:
    """Write a file into ``disk`` until it is full (ENOSPC); returns the file."""
    filler = disk / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


def write_spec(directory: Path, doc: dict[str, Any], filename: str = "job.yaml") -> Path:
    """Write a spec document as YAML and return its path."""
    path = directory / filename
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli_env() -> dict[str, str]:
    """The environment for CLI subprocesses (no colors, no terminal tricks)."""
    env = dict(os.environ)
    env.update({"NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    env.pop("GPUFLEET_FAULTS", None)
    return env


def gpufleet_cmd(*args: str) -> list[str]:
    """argv for the CLI in this interpreter."""
    return [sys.executable, "-m", "gpufleet.cli.main", *args]


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``gpufleet ARGS`` to completion."""
    return subprocess.run(
        gpufleet_cmd(*args),
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON summary that ``gpufleet run -o json`` printed."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no stdout; stderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def processes_mentioning(text: str, cwd: Path | None = None) -> list[psutil.Process]:
    """Live processes whose command line or working directory mentions ``text``; with ``cwd``,
    only those working there (read once in the listing: another test's processes come and go)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd, where = " ".join(p.info["cmdline"] or []), p.info["cwd"] or ""
            mentions = text in cmd or text == where
            if p.pid != os.getpid() and mentions and (cwd is None or where == str(cwd)):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_no_processes(text: str, timeout: float = 15) -> list[psutil.Process]:
    """Wait until no process mentions ``text``; return the ones left after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_mentioning(text)
    return left


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A scratch working directory; fails the test if processes started there outlive it."""
    yield tmp_path
    left = wait_no_processes(str(tmp_path))
    for p in left:
        p.kill()
    assert not left, f"orphan processes: {[(p.pid, p.cmdline()) for p in left]}"


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The session's own gpufleet cache (the digits arrays): nothing read from, or left in, the
    user's; the first worker of the session fills it, the others read it."""
    from gpufleet.runtime.context import ENV_CACHE_DIR

    os.environ[ENV_CACHE_DIR] = str(tmp_path_factory.mktemp("gpufleet-cache"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests without CUDA and `cluster` tests without KUBECONFIG, with the reason;
    order the modules (work_unit)."""
    strays = sorted({item.nodeid.split("::")[0] for item in items
                     if "devcluster" in getattr(item, "fixturenames", ())
                     and work_unit(item.nodeid) != CONTROL_PLANE})  # fmt: skip
    if strays:  # it would start a second control plane in its own worker
        raise pytest.UsageError(f"tests using the devcluster fixture belong in {CONTROL_PLANE}/: "
                                f"{', '.join(strays)}")  # fmt: skip
    in_one_process = not hasattr(config, "workerinput")
    slow = {work_unit(item.nodeid) for item in items if "slow" in item.keywords}

    def rank(item: pytest.Item) -> tuple[bool, ...]:
        unit = work_unit(item.nodeid)
        if in_one_process:
            return (unit == CONTROL_PLANE,)
        return (unit != CONTROL_PLANE, unit not in slow)

    items.sort(key=rank)
    import torch

    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    no_cluster = pytest.mark.skip(reason="needs a live Kubernetes cluster (KUBECONFIG unset)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "cluster" in item.keywords and not os.environ.get("KUBECONFIG"):
            item.add_marker(no_cluster)


# The modules that use the session's control plane (the devcluster fixture) live here.
CONTROL_PLANE = "tests/controlplane"


def work_unit(nodeid: str) -> str:
    """What runs whole, in one process: a test module (its module fixtures are set up once), or
    all of tests/controlplane/ (one control plane per process: a second would cost a minute
    to start, and the MPI operator's fixed port allows only one).

    In one process the control plane's modules run last: it runs from their first test to the
    end of the session, and its processes would otherwise run beside every test after them.
    Under pytest-xdist (`make test`: ``-n auto``, this scheduler) a worker takes the next unit
    when it is done, in this order: the control plane's first (mostly waiting on controllers,
    it runs beside the rest), then the modules with `slow` tests (real processes, seconds
    each), then the others."""
    module = nodeid.split("::")[0]
    return CONTROL_PLANE if module.startswith(CONTROL_PLANE + "/") else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's own scope scheduler, by work_unit (its `--dist loadgroup` marks no longer group
    on pytest 9.2: pytest-xdist issue 1386), in the order the workers collected."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return ByWorkUnit(config, log)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The local control plane (`gpufleet cluster up`: 3 nodes x 4 A30, Kueue, JobSet), started
    once per test session and stopped at its end (tests/devcluster.py)."""
    from tests.devcluster import session_cluster

    yield from session_cluster(tmp_path_factory)


def pod_templates(obj: Any) -> Iterator[dict[str, Any]]:
    """Every pod template inside a rendered object (Job, JobSet, Kubeflow and Volcano kinds)."""
    if isinstance(obj, dict):
        template = obj.get("template")
        if isinstance(template, dict) and "containers" in template.get("spec", {}):
            yield template
        for value in obj.values():
            yield from pod_templates(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from pod_templates(value)


def stop_processes(procs: list[subprocess.Popen[Any]], timeout: float = 30) -> None:
    """SIGTERM each process still running (last started first), then wait; SIGKILL laggards."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
