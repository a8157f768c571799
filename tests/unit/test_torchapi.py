"""gpufleet.torchapi: where torch's API differs inside gpufleet's range. Each test holds on every
torch of the range (`make compat TORCH=<version>` runs them at the floor and the newest), taking
the path the installed torch takes (the FSDP2 gradient mean over Gloo, with worker processes:
tests/integration/test_fsdp_gloo.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from torch.distributed.launcher.api import LaunchConfig

from gpufleet import torchapi
from tests.support.paths import REPO


def test_async_save_commits_through_this_torchs_path(tmp_path: Path) -> None:
    """With a stager (torch 2.9+) the staging is its own future; without one (torch 2.8)
    async_save has copied the state when it returns."""
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_loader import load

    stager = torchapi.new_stager(cuda=False)
    staging = importable("torch.distributed.checkpoint.staging", "DefaultStager")
    assert (stager is None) == (not staging)
    state = {"w": torch.arange(4.0)}
    staged, upload = torchapi.async_save(state, FileSystemWriter(str(tmp_path)), None, stager)
    if staged is not None:
        staged.result()
    state["w"] += 1  # after staging: the checkpoint keeps what was staged
    upload.result()
    back = {"w": torch.zeros(4)}
    load(back, checkpoint_id=str(tmp_path))
    assert torch.equal(back["w"], torch.arange(4.0))
    if stager is not None:
        stager.close()


def test_the_shutdown_timeout_is_given_where_launchconfig_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    has = "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}
    assert torchapi.shutdown_timeout(45.7) == ({"shutdown_timeout": 45} if has else {})
    # torch 2.11's LaunchConfig, as far as this goes: no such field (make compat runs 2.8's)
    older = dataclasses.make_dataclass("LaunchConfig", [("min_nodes", int), ("max_nodes", int)])
    assert torchapi.shutdown_timeout(45.7, older) == {}
    if has:
        assert torchapi.shutdown_timeout(0.2) == {"shutdown_timeout": 1}
        # What a pod's torchrun reads (the renderers set it; gpufleet.render.podspec)
        monkeypatch.setenv(torchapi.ENV_SHUTDOWN_TIMEOUT, "45")
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1)
        assert config.shutdown_timeout == 45


def importable(module: str, name: str) -> bool:
    try:
        return hasattr(__import__(module, fromlist=[name]), name)
    except ImportError:
        return False


def test_dcp_fsspec_storage_is_the_public_module_where_torch_has_it() -> None:
    module = torchapi.fsspec_filesystem()
    assert hasattr(module, "FsspecReader") and hasattr(module, "FsspecWriter")
    public = importable("torch.distributed.checkpoint.fsspec_filesystem", "FsspecReader")
    assert module.__name__.rsplit(".", 1)[-1] == (
        "fsspec_filesystem" if public else "_fsspec_filesystem"
    )


def test_the_range_takes_nvidias_builds_of_its_floor() -> None:
    """NVIDIA's PyTorch images carry torch as a pre-release of its version: 2.8.0a0+<commit>.
    nv25.8 comes before 2.8.0, which "torch>=2.8" refused (pip then replaced the image's torch,
    or failed). The floor stays: 2.7 is out."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    for inside in ("2.8.0a0+34c6371d24.nv25.8", "2.8.0", "2.10.0a0+b4e4ee81d3.nv25.12", "2.15.0"):
        assert torch.specifier.contains(inside), inside
    for outside in ("2.7.1", "2.7.0a0+79aa17489c.nv25.4"):
        assert not torch.specifier.contains(outside, prereleases=True), outside
