"""A team's own PyTorch image for the real-node tests (docs/images.md "Your own PyTorch
image"): ``scripts/build-image.sh own`` builds a stand-in for one (torch at gpufleet's floor,
not the pinned build of gpufleet's image) and adds gpufleet to it with the page's two lines
(examples/own-image/Dockerfile). Its archive holds that image; a second archive holds the
stand-in as it was, with no gpufleet. The local run that the pods must match runs in the image
itself (buildah, chroot isolation), on its torch."""

from __future__ import annotations

import functools
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devcluster.realnodes.images import image_cache, names_in
from tests.support.paths import REPO
from tests.support.references import SHORT, WORKLOAD
from tests.support.specs import digits_job


@dataclass(frozen=True)
class OwnImages:
    with_gpufleet: str  # localhost/gpufleet:own-<key>
    without: str  # localhost/gpufleet:ownbase-<key>
    archives: tuple[Path, Path]


@functools.cache
def own_images() -> OwnImages:
    """Both images, built when their inputs changed (a no-op otherwise)."""
    built = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "own"],
                           capture_output=True, text=True, cwd=REPO, timeout=3600)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    archive = (image_cache() / "gpufleet-own.tar").resolve()
    (base,) = sorted(image_cache().glob("gpufleet-ownbase-*.tar"))  # one: the build prunes
    return OwnImages(names_in(archive)[0], names_in(base)[0], (archive, base))


def in_image(image: str, *argv: str, work: Path, timeout: float = 600) -> str:
    """``argv`` in a container of ``image`` (as root, ``work`` at /work); its stdout."""
    work.mkdir(parents=True, exist_ok=True)
    container = subprocess.run(["buildah", "from", "--quiet", image], capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    try:
        done = subprocess.run(["buildah", "run", "--isolation", "chroot", "--user", "0:0", "-v",
                               f"{work}:/work", container, "--", *argv], capture_output=True,
                              text=True, timeout=timeout, check=False)  # fmt: skip
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def local_digest_in(image: str, work: Path, nodes: int, procs: int) -> str:
    """The state digest of `gpufleet run` of the digits job of that world in ``image``: the
    weights that job must end with on that image's torch (tests.support.references' job)."""
    steps, every = SHORT
    checkpoint = {"dir": "/work/ckpt", "everySteps": every}
    doc = digits_job("own-local", workload={**WORKLOAD, "steps": steps}, nodes=nodes,
                     procsPerNode=procs, checkpoint=checkpoint)  # fmt: skip
    (work / "job.yaml").write_text(yaml.safe_dump(doc))
    out = in_image(image, "gpufleet", "run", "/work/job.yaml", "-o", "json", work=work)
    return str(json.loads(out)["state_digest"])


def torch_in(image: str, work: Path) -> str:
    """The version of the torch that ``image`` carries."""
    return in_image(image, "python", "-c", "import torch; print(torch.__version__)",
                    work=work).strip()  # fmt: skip


def tiny_archive(name: str, content: str, where: Path) -> Path:
    """An OCI archive of a one-file image ``name`` (buildah, from scratch)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "file").write_text(content)

    def buildah(*args: str) -> str:
        return subprocess.run(["buildah", *args], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    container = buildah("from", "scratch")
    try:
        buildah("copy", container, str(where / "file"), "/file")
        buildah("commit", "-q", container, name)
        archive = where / f"{content}.tar"
        buildah("push", "-q", name, f"oci-archive:{archive}:{name}")
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        subprocess.run(["buildah", "rmi", name], capture_output=True, check=False)
    return archive


def node_ctr(state_dir: Path, node: str, *args: str) -> str:
    """``ctr ARGS`` on real node ``node``'s containerd (CRI's namespace); its stdout."""
    from gpufleet.devcluster.realnodes.chaos import find_node

    real, state = find_node(state_dir, node)
    ctr = [str(Path(state.binaries) / "ctr"), "--address", str(real.paths.containerd_socket),
           "--namespace", "k8s.io", *args]  # fmt: skip
    return subprocess.run(ctr, capture_output=True, text=True, check=True).stdout


def node_images(state_dir: Path, node: str) -> list[str]:
    """The names in real node ``node``'s image store."""
    return node_ctr(state_dir, node, "images", "list", "--quiet").split()


def diff_ids_in(archive: Path) -> list[str]:
    """The layers' uncompressed digests of the one image in an OCI archive (its config's)."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> Any:
            member = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None, digest
            return json.loads(member.read())

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = blob(index["manifests"][0]["digest"])
        return list(blob(manifest["config"]["digest"])["rootfs"]["diff_ids"])
