"""A team's own PyTorch image on real nodes (docs/images.md "Your own PyTorch image"): gpufleet
added with the page's two lines to an image whose torch is gpufleet's floor, not the pinned
build of gpufleet's own image, loaded into the nodes with `gpufleet cluster load`; digits 2x1
queued by Kueue on it ends with the weights of the same job run locally on that torch. An
image without gpufleet fails in one line from `gpufleet status` and `logs`: what it lacks and
the page's fix."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufleet.cluster.imagecheck import DOC
from gpufleet.devcluster.realnodes.images import chain_id
from gpufleet.errors import ClusterError, UserInputError
from gpufleet.runtime.integrity import MARKER
from tests.support.cli import run_cli
from tests.support.devcluster import DevCluster
from tests.support.ownimage import (
    OwnImages,
    diff_ids_in,
    local_digest_in,
    node_ctr,
    node_images,
    own_images,
    tiny_archive,
    torch_in,
)
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT, digests_in_logs, node_ready, real_job
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip


@pytest.fixture(scope="module")
def loaded(reallab: DevCluster) -> Iterator[OwnImages]:
    """Both images built (scripts/build-image.sh own) and loaded into every real node."""
    images = own_images()
    load = run_cli("cluster", "load", *map(str, images.archives), "--dir", str(reallab.dir),
                   cwd=reallab.root, timeout=600)  # fmt: skip
    assert load.returncode == 0, load.stderr[-3000:]
    assert images.with_gpufleet in load.stderr and images.without in load.stderr, load.stderr
    yield images


@pytest.fixture
def submitted(reallab: DevCluster) -> Iterator[list[str]]:
    """The jobs a test submits, cancelled after it whatever its outcome: a failed test's pods
    would hold the nodes from the tests after it (seen: pods of an image that could not start
    kept the next module's jobs to one node)."""
    names: list[str] = []
    yield names
    for name in names:
        # The test cancels its job itself: going (404 on delete) or gone (no such job) then.
        with contextlib.suppress(ClusterError, UserInputError):
            reallab.cancel(name, TENANT)


def has_image(cluster: DevCluster, node: str, image: str) -> bool:
    """Whether the node's status lists ``image`` (by its name, with or without a registry)."""
    names = [n for i in cluster.core.read_node(node).status.images or [] for n in i.names or []]
    return any(n == image or n.endswith(f"/{image}") for n in names)


def test_digits_on_a_teams_image_with_another_torch_ends_with_that_torchs_local_weights(
    reallab: DevCluster, loaded: OwnImages, submitted: list[str]
) -> None:
    work = reallab.root / "own-local"
    floor = torch_in(loaded.with_gpufleet, work)
    import torch

    assert floor.split("+")[0] != torch.__version__.split("+")[0], "the same torch as the suite's"
    name = "digits-own-2x1"
    submitted.append(name)
    # A node that an earlier test cut off (node loss, partition) must be Ready again, or the
    # scheduler puts both pods on the other one (seen once, after the node-loss test).
    nodes = [n.metadata.name for n in reallab.core.list_node().items
             if n.metadata.name.startswith("real-")]  # fmt: skip
    for node in nodes:
        poll_until(lambda n=node: node_ready(reallab, n), what=f"{node} Ready", timeout=120)
        # The scheduler scores a node that has a pod's image higher (ImageLocality, by the
        # image's size: 3 GB, its highest score), from the images the node's status lists. The
        # kubelet updates that list every 10 s: until both list the image just loaded, both
        # pods go to the one that does (seen twice).
        poll_until(lambda n=node: has_image(reallab, n, loaded.with_gpufleet),
                   what=f"{node}'s status to list {loaded.with_gpufleet}", timeout=120)  # fmt: skip
    doc = real_job(name, 2, 1)
    doc["spec"]["image"] = loaded.with_gpufleet
    with ThreadPoolExecutor(1) as pool:  # the local run in the image, beside the pods
        local = pool.submit(local_digest_in, loaded.with_gpufleet, work, 2, 1)
        submit = reallab.gpufleet("submit", str(write_spec(reallab.root, doc, f"{name}.yaml")))
        assert submit.returncode == 0, submit.stderr[-2000:]
        phase, pods = reallab.run_to_end(name, TENANT, timeout=300)
        assert phase == "Succeeded", reallab.gpufleet("status", name, "-n", TENANT).stdout
        assert {p["spec"]["containers"][0]["image"] for p in pods.values()} == {
            loaded.with_gpufleet}  # fmt: skip
        assert len({p["spec"]["nodeName"] for p in pods.values()}) == 2
        assert digests_in_logs(reallab, name) == [local.result()]
    # The pods' checkpoints say which torch wrote them: the image's, not the suite's.
    markers = list((reallab.dir / "volumes").glob(f"pv-*/{name}/step_*/{MARKER}"))
    assert markers and {json.loads(m.read_text())["torch"] for m in markers} == {floor}
    assert reallab.cancel(name, TENANT)


def test_an_image_without_gpufleet_fails_in_one_line_that_names_the_fix(
    reallab: DevCluster, loaded: OwnImages, submitted: list[str]
) -> None:
    name = "digits-no-gpufleet"
    submitted.append(name)
    doc = real_job(name, 2, 1)
    doc["spec"]["image"] = loaded.without
    submit = reallab.gpufleet("submit", str(write_spec(reallab.root, doc, f"{name}.yaml")))
    assert submit.returncode == 0, submit.stderr[-2000:]
    lacking = f"image {loaded.without} has no gpufleet"

    def told() -> subprocess.CompletedProcess[str] | None:
        status = reallab.gpufleet("status", name, "-n", TENANT)
        return status if lacking in status.stdout else None

    status = poll_until(
        told, what=f"{name}: status names what the image lacks", timeout=240, interval=3
    )
    lines = [line for line in status.stdout.splitlines() if lacking in line]
    assert len(lines) == 1 and status.stdout.count(lacking) == 1, status.stdout
    assert DOC in lines[0] and "pip install gpufleet" in lines[0], lines[0]
    logs = reallab.gpufleet("logs", name, "-n", TENANT)
    assert logs.returncode == 0, logs.stderr[-2000:]
    assert logs.stderr.count(lacking) == 1 and DOC in logs.stderr, logs.stderr
    for out in (status.stdout, status.stderr, logs.stdout, logs.stderr):
        assert "Traceback" not in out, out
    assert reallab.cancel(name, TENANT)


def test_a_new_build_replaces_its_older_one_on_every_node_and_other_images_stay(
    reallab: DevCluster, loaded: OwnImages
) -> None:
    """`cluster load` of another build of a project image (localhost/gpufleet:<flavor>-<key>):
    the older build goes from every node, its ID and stable name with it (containerd collects
    its layers), the stable name follows the new build, and the other images stay."""
    old, new = "localhost/gpufleet:tiny-00000000000a", "localhost/gpufleet:tiny-00000000000b"
    nodes = ("real-a30-node-0", "real-a30-node-1")
    before = {node: set(node_images(reallab.dir, node)) for node in nodes}
    try:
        for name, content in ((old, "a"), (new, "b")):
            archive = tiny_archive(name, content, reallab.root / "tiny")
            load = run_cli("cluster", "load", str(archive), "--dir", str(reallab.dir),
                           cwd=reallab.root, timeout=120)  # fmt: skip
            assert load.returncode == 0, load.stderr[-2000:]
        for node in nodes:

            def added(node: str = node) -> set[str] | None:
                """What the loads left: the new build, its stable name and its ID, which CRI
                adds once it has seen the image (the old build's gone with its ID)."""
                new_names = set(node_images(reallab.dir, node)) - before[node]
                return new_names if len(new_names) >= 3 else None

            names = poll_until(added, what=f"{node}: the new build and its ID", timeout=30)
            ids = [n for n in names if n.startswith("sha256:")]
            assert names - set(ids) == {new, "localhost/gpufleet:tiny"} and len(ids) == 1, names
            assert {loaded.with_gpufleet, loaded.without} <= set(node_images(reallab.dir, node))
    finally:
        for node in nodes:
            gone = set(node_images(reallab.dir, node)) - before[node]
            if gone:
                node_ctr(reallab.dir, node, "images", "remove", "--sync", *gone)


def test_an_image_whose_layers_were_lost_is_imported_again(reallab: DevCluster) -> None:
    """An import that failed part way (the disk full) leaves an image's record without its
    unpacked layers, their compressed copies discarded: the next `cluster load` imports it
    again instead of taking the record for the image (every later job of a team's image
    failed to start so: "failed to extract layer ... not found")."""
    name, node = "localhost/gpufleet-test:lost-layers", "real-a30-node-0"
    archive = tiny_archive(name, "lost", reallab.root / "lost")
    top = chain_id(diff_ids_in(archive))

    def load() -> None:
        done = run_cli("cluster", "load", str(archive), "--dir", str(reallab.dir),
                       cwd=reallab.root, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]

    try:
        load()
        node_ctr(reallab.dir, node, "snapshots", "info", top)  # unpacked
        node_ctr(reallab.dir, node, "snapshots", "remove", top)  # lost; the record stays
        assert name in node_images(reallab.dir, node)
        with pytest.raises(subprocess.CalledProcessError):
            node_ctr(reallab.dir, node, "snapshots", "info", top)
        load()
        node_ctr(reallab.dir, node, "snapshots", "info", top)  # unpacked again
    finally:
        for each in ("real-a30-node-0", "real-a30-node-1"):
            node_ctr(reallab.dir, each, "images", "remove", "--sync", name)
