"""The image's OCI archive (scripts/oci_archive.py, build-image.sh's export_archive): every blob
named by its digest, every layer compressed and its diff ID once decompressed, and the layers
an earlier archive holds taken from it instead of compressed again."""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import script_module

NAME = "localhost/gpufleet:cpu-0123456789ab"
REF_NAME = "org.opencontainers.image.ref.name"
LAYER = "application/vnd.oci.image.layer.v1.tar"


@pytest.fixture(scope="module")
def oa() -> ModuleType:
    return script_module("oci_archive")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pushed(layout: Path, layers: list[bytes]) -> None:
    """What `buildah push` (containers/image 5.23) leaves in a seeded layout: a layer whose
    diff ID has a stand-in there kept as it is, named so, uncompressed and of the stand-in's
    size; each other one compressed (gzip here, zstd in the build); the config, the
    manifest, the index naming it."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes, media_type: str) -> dict[str, object]:
        (blobs / _digest(data).split(":")[1]).write_bytes(data)
        return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}

    descriptors = []
    for data in layers:
        stand_in = blobs / _digest(data).split(":")[1]
        if stand_in.exists():
            descriptors.append({"mediaType": LAYER, "digest": _digest(data), "size": 0})
        else:
            descriptors.append(put(gzip.compress(data, mtime=0), LAYER + "+gzip"))
    rootfs = {"type": "layers", "diff_ids": [_digest(d) for d in layers]}
    config = put(
        json.dumps({"rootfs": rootfs}).encode(), "application/vnd.oci.image.config.v1+json"
    )
    manifest = {"schemaVersion": 2, "config": config, "layers": descriptors}
    entry = put(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    entry["annotations"] = {REF_NAME: NAME}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))


def contents(archive: Path) -> dict[str, bytes]:
    """Every member of the archive, each blob checked against the digest that names it, and
    each layer decompressed, checked against its diff ID."""
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
        assert len(tar.getnames()) == len(files), "a member written twice"
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"][REF_NAME] == NAME
    manifest_bytes = files["blobs/sha256/" + entry["digest"].split(":")[1]]
    assert entry["size"] == len(manifest_bytes)
    manifest = json.loads(manifest_bytes)
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        assert layer["mediaType"] == LAYER + "+gzip"
        blob = files["blobs/sha256/" + layer["digest"].split(":")[1]]
        assert len(blob) == layer["size"]
        assert _digest(gzip.decompress(blob)) == diff_id
    return files


def test_a_first_archive_holds_every_layer_as_pushed(oa: ModuleType, tmp_path: Path) -> None:
    empty = b"\0" * 1024  # an empty tar: a step that changed no file, twice
    assert oa.seed(tmp_path / "layout", []) == 0
    pushed(tmp_path / "layout", [b"base" * 5000, empty, b"torch" * 9000, empty])
    assert oa.pack(tmp_path / "layout", NAME, tmp_path / "a.tar", []) == (0, 3)
    files = contents(tmp_path / "a.tar")
    assert files["oci-layout"] == b'{"imageLayoutVersion": "1.0.0"}'
    assert len([n for n in files if n.startswith("blobs/")]) == 3 + 2  # layers, config, manifest


def test_the_next_archive_takes_the_held_layers_from_the_last(
    oa: ModuleType, tmp_path: Path
) -> None:
    base, torch, src = b"base" * 5000, b"torch" * 9000, b"src v2" * 100
    pushed(tmp_path / "first", [base, torch, b"src v1" * 100])
    oa.pack(tmp_path / "first", NAME, tmp_path / "a.tar", [])
    before = contents(tmp_path / "a.tar")
    # The seed holds an empty stand-in for each layer of a.tar: the push writes only src v2.
    assert oa.seed(tmp_path / "next", [tmp_path / "a.tar", tmp_path / "missing.tar"]) == 3
    stand_in = tmp_path / "next" / "blobs" / "sha256" / _digest(torch).split(":")[1]
    assert stand_in.stat().st_size == 0
    pushed(tmp_path / "next", [base, torch, src])
    assert oa.pack(tmp_path / "next", NAME, tmp_path / "b.tar", [tmp_path / "a.tar"]) == (2, 1)
    after = contents(tmp_path / "b.tar")
    kept = {n: d for n, d in before.items() if n.startswith("blobs/") and n in after}
    assert len(kept) == 2  # base and torch, compressed as they were
    assert all(after[n] == d for n, d in kept.items())


def test_an_unreadable_archive_is_said_and_a_stand_in_it_left_refused(
    oa: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pushed(tmp_path / "first", [b"base" * 5000])
    oa.pack(tmp_path / "first", NAME, tmp_path / "a.tar", [])
    oa.seed(tmp_path / "layout", [tmp_path / "a.tar"])
    pushed(tmp_path / "layout", [b"base" * 5000])
    (tmp_path / "a.tar").write_bytes(b"not a tar")  # gone bad between the seed and the pack
    with pytest.raises(ValueError, match=r"in .* is not as pushed"):
        oa.pack(tmp_path / "layout", NAME, tmp_path / "b.tar", [tmp_path / "a.tar"])
    assert f"{tmp_path / 'a.tar'}: nothing reused" in capsys.readouterr().err


def test_the_own_image_takes_its_bases_layers_and_a_damaged_one_is_refused(
    oa: ModuleType, tmp_path: Path
) -> None:
    torch, gpufleet = b"torch 2.8" * 9000, b"gpufleet" * 100
    pushed(tmp_path / "base", [torch])  # the stand-in for a team's image: another archive
    oa.pack(tmp_path / "base", NAME, tmp_path / "base.tar", [])
    oa.seed(tmp_path / "own", [tmp_path / "last-own.tar", tmp_path / "base.tar"])
    pushed(tmp_path / "own", [torch, gpufleet])
    assert oa.pack(tmp_path / "own", NAME, tmp_path / "own.tar", [tmp_path / "base.tar"]) == (1, 1)
    contents(tmp_path / "own.tar")
    # The base archive's torch layer damaged in place (same size): the next pack refuses it.
    data = bytearray((tmp_path / "base.tar").read_bytes())
    at = data.index(gzip.compress(torch, mtime=0)[-64:])
    data[at] ^= 0xFF
    (tmp_path / "base.tar").write_bytes(bytes(data))
    oa.seed(tmp_path / "again", [tmp_path / "base.tar"])
    pushed(tmp_path / "again", [torch, gpufleet])
    with pytest.raises(ValueError, match="is damaged"):
        oa.pack(tmp_path / "again", NAME, tmp_path / "bad.tar", [tmp_path / "base.tar"])
