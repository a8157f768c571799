"""An image's OCI archive whose layers an earlier archive holds are taken from there instead of
compressed again (scripts/build-image.sh, export_archive):

    python3 scripts/oci_archive.py seed LAYOUT [ARCHIVE...]
    buildah push --compression-format zstd IMAGE oci:LAYOUT:IMAGE
    python3 scripts/oci_archive.py pack LAYOUT IMAGE OUT [ARCHIVE...]

Why by hand: buildah 1.28's containers/image (5.23) compresses every layer again for an OCI
destination, even into a layout that holds them compressed (benchmarks/results/image-build_*):
torch's 4.9 GB layer, minutes of a build, for each change of one file in src/. What it does
skip is a layer whose own digest (its diff ID, the uncompressed one) its layout holds: so the
layout is seeded with an empty stand-in for each layer the earlier archives hold (their
manifests' layers beside their configs' diff_ids), the push compresses and writes only the
others, and pack puts the held layers in from those archives, compressed as they are there.
containerd checks each blob's digest as it imports the archive, and each layer's diff ID as it
unpacks it. Standard library only: it runs before the project's environment exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REF_NAME = "org.opencontainers.image.ref.name"
LAYER = "application/vnd.oci.image.layer.v1.tar"  # uncompressed; "+zstd", "+gzip" compressed
COPY_BUFFER = 1 << 20
OCI_LAYOUT = b'{"imageLayoutVersion": "1.0.0"}'  # the layout's version file, in both


@dataclass(frozen=True)
class Held:
    """A compressed layer in an earlier archive: where it is and what it is."""

    archive: Path
    media_type: str
    digest: str
    size: int


def _blob(digest: str) -> str:
    algorithm, hexits = digest.split(":", 1)
    return f"blobs/{algorithm}/{hexits}"


def _json_member(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name)
    if member is None:
        raise KeyError(name)
    return json.load(member)


def held_layers(archives: list[Path]) -> dict[str, Held]:
    """Each compressed layer of the archives' images, by its diff ID; an archive that is missing
    (a first build) or unreadable in part (said) adds nothing: its layers are compressed again."""
    held: dict[str, Held] = {}
    for archive in filter(Path.is_file, archives):
        try:
            held |= _layers_of(archive)
        except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
            print(f"oci_archive: {archive}: nothing reused ({exc!r})", file=sys.stderr)
    return held


def _layers_of(archive: Path) -> dict[str, Held]:
    found: dict[str, Held] = {}
    with tarfile.open(archive) as tar:
        for entry in _json_member(tar, "index.json").get("manifests", []):
            manifest = _json_member(tar, _blob(entry["digest"]))
            config = _json_member(tar, _blob(manifest["config"]["digest"]))
            pairs = zip(config["rootfs"]["diff_ids"], manifest["layers"], strict=True)
            for diff_id, layer in pairs:
                if layer["mediaType"].startswith(LAYER + "+"):
                    found[diff_id] = Held(archive, layer["mediaType"], layer["digest"],
                                          layer["size"])  # fmt: skip
    return found


def seed(layout: Path, archives: list[Path]) -> int:
    """An empty layout with a stand-in blob for each held layer; how many."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_bytes(OCI_LAYOUT)
    (layout / "index.json").write_text('{"schemaVersion": 2, "manifests": []}')
    held = held_layers(archives)
    for diff_id in held:
        (layout / _blob(diff_id)).touch()
    return len(held)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


class _Hashing:
    """A blob read as tarfile.addfile reads it, hashed on the way."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.sha256 = raw, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk: bytes = self.raw.read(size)
        self.sha256.update(chunk)
        return chunk


def _copy_held(out: tarfile.TarFile, layer: Held, source: tarfile.TarFile) -> None:
    """The held blob from its archive (open as ``source``) into ``out``, checked against its
    digest on the way: a damaged one would otherwise pass on to every archive after it
    (containerd finds it only at import)."""
    member = source.getmember(_blob(layer.digest))
    if member.size != layer.size:
        raise ValueError(f"{layer.archive}: {layer.digest} is {member.size} bytes")
    info = tarfile.TarInfo(member.name)
    info.size = member.size
    blob = _Hashing(source.extractfile(member))
    out.addfile(info, blob)
    if "sha256:" + blob.sha256.hexdigest() != layer.digest:
        raise ValueError(f"{layer.archive}: {layer.digest} is damaged (its sha256 differs)")


def pack(layout: Path, name: str, out: Path, archives: list[Path]) -> tuple[int, int]:
    """The layout's image ``name`` as the archive ``out``: each layer pushed as a stand-in taken
    from the archive that holds it, the others as pushed. (reused, pushed)."""
    index = json.loads((layout / "index.json").read_text())
    entry = next(m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) == name)
    manifest = json.loads((layout / _blob(entry["digest"])).read_bytes())
    config_bytes = (layout / _blob(manifest["config"]["digest"])).read_bytes()
    diff_ids = json.loads(config_bytes)["rootfs"]["diff_ids"]
    held = held_layers(archives)
    blobs: dict[str, Held | Path] = {}  # by digest: a layer may repeat
    layers: list[dict[str, Any]] = []
    for diff_id, layer in zip(diff_ids, manifest["layers"], strict=True):
        found = held.get(diff_id) if layer["digest"] == diff_id else None
        if found is not None:
            layer = {**layer, "mediaType": found.media_type, "digest": found.digest,
                     "size": found.size}  # fmt: skip
            blobs[found.digest] = found
        else:
            path = layout / _blob(layer["digest"])
            size = path.stat().st_size
            if size == 0 or size != layer["size"]:  # a stand-in no archive holds: not pushed
                raise ValueError(f"{name}: {layer['digest']} in {layout} is not as pushed")
            blobs[layer["digest"]] = path
        layers.append(layer)
    manifest_bytes = json.dumps({**manifest, "layers": layers}, separators=(",", ":")).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    entry = {**entry, "digest": manifest_digest, "size": len(manifest_bytes)}
    with contextlib.ExitStack() as opened, tarfile.open(out, "w", copybufsize=COPY_BUFFER) as tar:
        sources = {a: opened.enter_context(tarfile.open(a))  # each read once: its members listed
                   for a in {b.archive for b in blobs.values() if isinstance(b, Held)}}  # fmt: skip
        _add_bytes(tar, "oci-layout", OCI_LAYOUT)
        for digest, source in blobs.items():
            if isinstance(source, Held):
                _copy_held(tar, source, sources[source.archive])
            else:  # and out of the layout at once: the disk holds each blob once
                tar.add(source, _blob(digest))
                source.unlink()
        _add_bytes(tar, _blob(manifest["config"]["digest"]), config_bytes)
        _add_bytes(tar, _blob(manifest_digest), manifest_bytes)
        _add_bytes(tar, "index.json", json.dumps({**index, "manifests": [entry]}).encode())
    reused = sum(isinstance(source, Held) for source in blobs.values())
    return reused, len(blobs) - reused


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "seed":
        count = seed(Path(argv[1]), [Path(a) for a in argv[2:]])
        print(f"layers held by earlier archives: {count}")
        return 0
    if len(argv) >= 4 and argv[0] == "pack":
        reused, new = pack(Path(argv[1]), argv[2], Path(argv[3]), [Path(a) for a in argv[4:]])
        print(f"layers: {reused} from earlier archives, {new} pushed")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
