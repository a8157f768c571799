"""The names real nodes give images imported with no registry, and the layers they share
(devcluster/realnodes/images.py)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from gpufleet.devcluster.realnodes.images import share_files, stable_name
from gpufleet.devcluster.realnodes.node import SNAPSHOTS, written_dirs


def test_each_build_of_the_project_image_has_a_stable_name_and_no_other_image_does() -> None:
    """The name every real node gives the project's image beside its build's (issue 51): what
    job specs and the chart's values for the local cluster name."""
    assert stable_name("localhost/gpufleet:cpu-0375e6860aa5") == "localhost/gpufleet:cpu"
    assert stable_name("localhost/gpufleet:cuda-0375e6860aa5") == "localhost/gpufleet:cuda"
    for other in ("localhost/gpufleet:cpu", "registry.k8s.io/pause:3.10",
                  "localhost/gpufleet-base:bookworm", "ghcr.io/x/gpufleet:cpu-0375e6860aa5",
                  "localhost/gpufleet:cpu-0375e6860aa5-build"):  # fmt: skip
        assert stable_name(other) is None, other


def test_the_nodes_copies_of_a_layer_are_stored_once(tmp_path: Path) -> None:
    """What two nodes unpacked of the same layer (images.share_files): identical files become
    one, on the disk; a file that differs, or that one node holds alone, stays its own."""
    layers = []
    for node in ("node-0", "node-1"):
        fs = tmp_path / node / "snapshots" / "7" / "fs"
        (fs / "lib").mkdir(parents=True)
        (fs / "lib" / "libtorch.so").write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
        (fs / "own").write_text(node)
        os.utime(fs / "lib" / "libtorch.so", (1_700_000_000, 1_700_000_000))
        layers.append(fs)
    said = share_files(layers)
    assert "Linked: 1 files" in said, said
    lib = [(fs / "lib" / "libtorch.so").stat() for fs in layers]
    assert lib[0].st_ino == lib[1].st_ino and lib[0].st_nlink == 2
    own = [(fs / "own").stat() for fs in layers]
    assert own[0].st_ino != own[1].st_ino
    assert share_files(layers[:1]) == "nothing to share"


def test_without_hardlink_the_layers_stay_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no util-linux here
    assert share_files([tmp_path / "a", tmp_path / "b"]).startswith("not shared: hardlink")


def test_cluster_load_needs_archives_and_a_cluster_with_real_nodes(tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    gone = run_cli("cluster", "load", str(tmp_path / "x.tar"), "--dir", str(tmp_path), cwd=tmp_path)
    assert gone.returncode == 2 and f"ARCHIVE: no such file: {tmp_path / 'x.tar'}" in gone.stderr
    index = {"manifests": [{"annotations": {"org.opencontainers.image.ref.name": "team/x:1"}}]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        tar.add(tmp_path / "index.json", "index.json")
    none = run_cli("cluster", "load", str(tmp_path / "x.tar"), "--dir", str(tmp_path), cwd=tmp_path)
    assert none.returncode == 1 and "no cluster with real nodes runs" in none.stderr, none.stderr
    assert "Traceback" not in gone.stderr + none.stderr


def test_a_containers_writable_layer_is_never_one_to_share() -> None:
    """RealNode.layer_dirs leaves out what an active snapshot writes to: an overlay's upper
    directory, a bound directory; its read-only layers stay layers."""

    def snap(n: int) -> str:
        return f"/c/n0/containerd/{SNAPSHOTS}/{n}/fs"

    overlay = (f"mount -t overlay overlay / -o index=off,workdir=/c/{SNAPSHOTS}/31/work,"
               f"upperdir={snap(31)},lowerdir={snap(5)}:{snap(4)}")  # fmt: skip
    assert written_dirs(overlay) == {snap(31)}
    assert written_dirs(f"mount -t bind {snap(7)} / -o rbind,rw") == {snap(7)}
    assert written_dirs("") == set()
