"""Images for real nodes, with no registry: OCI archives in a cache outside the checkout
(``image_cache()``), made by buildah and imported into each node's containerd. The pause image
(the sandbox every pod's network namespace lives in) is Kubernetes' own pause, built from its
module (scripts/build-controlplane.sh), packed under the name containerd pins for sandboxes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

from gpufleet.devcluster.realnodes.configs import SANDBOX_IMAGE
from gpufleet.errors import ClusterUpError

REF_NAME = "org.opencontainers.image.ref.name"
# The project's image (scripts/image-lib.sh names it): <repo>:<flavor>-<12 hex digits of its
# build's inputs>; every node also names it <repo>:<flavor>, which docs and job specs can use.
PROJECT_REPOSITORY = "localhost/gpufleet"
_HASHED = re.compile(rf"^(?P<stable>{re.escape(PROJECT_REPOSITORY)}:[a-z]+)-[0-9a-f]{{12}}$")


def stable_name(name: str) -> str | None:
    """``localhost/gpufleet:cpu`` for ``localhost/gpufleet:cpu-0123456789ab``; None for a
    name that is no build of the project's image."""
    match = _HASHED.match(name)
    return match["stable"] if match else None


def chain_id(diff_ids: list[str]) -> str:
    """The OCI chain ID of a stack of layers (their uncompressed digests, bottom first), which
    names the snapshot of the top one: ChainID(L0) = DiffID(L0), ChainID(L0..Ln) =
    sha256(ChainID(L0..Ln-1) + " " + DiffID(Ln)) (the image spec's config.md)."""
    chain = diff_ids[0]
    for diff in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff}".encode()).hexdigest()
    return chain


def image_cache() -> Path:
    """$GPUFLEET_IMAGE_CACHE, else ~/.cache/gpufleet/images (scripts/build-image.sh's too)."""
    default = Path.home() / ".cache" / "gpufleet" / "images"
    return Path(os.environ.get("GPUFLEET_IMAGE_CACHE", default))


def _buildah(*args: str) -> str:
    try:
        proc = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ClusterUpError(
            "buildah is not installed (real nodes' images are built with it): "
            "apt-get install buildah"
        ) from None
    if proc.returncode != 0:
        raise ClusterUpError(f"buildah {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def names_in(archive: Path) -> list[str]:
    """The image names an OCI archive's index gives (its ref.name annotations)."""
    try:
        with tarfile.open(archive) as tar:  # uncompressed: its headers are read, data skipped
            member = tar.extractfile("index.json")
            if member is None:
                raise KeyError("index.json")
            index = json.load(member)
    except (OSError, KeyError, tarfile.TarError, ValueError) as exc:
        raise ClusterUpError(f"{archive} is not an OCI archive (index.json: {exc})") from None
    return [m["annotations"][REF_NAME] for m in index.get("manifests", [])
            if REF_NAME in m.get("annotations", {})]  # fmt: skip


def pause_archive(binaries: Path) -> Path:
    """The pause image's OCI archive for the pause executable in ``binaries`` (made once per
    build of it): one layer holding /pause, run as 65535 as the upstream image does."""
    pause = binaries / "pause"
    digest = hashlib.sha256(pause.read_bytes()).hexdigest()[:16]
    archive = image_cache() / f"pause-{digest}.tar"
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    container = _buildah("from", "scratch")
    try:
        _buildah("copy", "--chmod", "0755", container, str(pause), "/pause")
        _buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
        _buildah("commit", "-q", container, SANDBOX_IMAGE)
        tmp = archive.with_suffix(".tmp")
        _buildah("push", "-q", SANDBOX_IMAGE, f"oci-archive:{tmp}:{SANDBOX_IMAGE}")
        tmp.replace(archive)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        subprocess.run(["buildah", "rmi", SANDBOX_IMAGE], capture_output=True, check=False)
    return archive


def share_files(layers: list[Path]) -> str:
    """Store the files that the nodes' copies of the same layers hold once: util-linux's
    ``hardlink`` links identical files (content, mode, owner, times, extended attributes) across
    ``layers``, the nodes' committed snapshots (RealNode.layer_dirs). Nodes on one host would
    otherwise keep one copy of each image a node (7 GB for the project's; the disk ran out).
    Only those: containerd never writes a committed layer again, and overlayfs copies a file up
    before a container changes it, so no node sees another's writes (a container's writable
    layer, which may be written in place, is never one of them). Returns hardlink's summary."""
    if len(layers) < 2:
        return "nothing to share"
    argv = ["hardlink", "--respect-xattrs", *map(str, sorted(layers))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return "not shared: hardlink (util-linux) is not installed"
    if done.returncode != 0:
        return f"not shared: hardlink failed: {done.stderr.strip()}"
    saved = [line for line in done.stdout.splitlines() if line.startswith(("Linked", "Saved"))]
    return ", ".join(" ".join(line.split()) for line in saved) or done.stdout.strip()
