"""Sealed Secrets on the session's real-node cluster (`cluster up --with sealed-secrets`, the
page's own): docs/local-cluster.md's group "sealed" seals an alert receiver's hook URL offline
and the real controller unseals it; a SealedSecret opens only as the Secret it was sealed for,
and a changed one not at all. The S3 credentials of the jobs that checkpoint to S3 on the real
nodes are sealed too (test_realnodes_training.py, its fixture ``pod_s3``)."""

from __future__ import annotations

import base64
import re

import pytest

from gpufleet.devcluster.platform import NAMESPACE
from tests.support.devcluster import DevCluster
from tests.support.docpages import blocks, failed
from tests.support.realnodes import LOCAL_CLUSTER_PAGE, TENANT
from tests.support.sealed import GROUP, PLURAL, VERSION, apply, refused, seal, unsealed

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(300)]  # fmt: skip
OTHER_TENANT = "product"  # the lab's other tenant (deploy/helm/gpufleet/ci/lab-3node-a30-values)


def page_sealed() -> tuple[str, str]:
    """The hook URL the page seals and the file its SealedSecret is written to."""
    (code,) = [b.code for b in blocks(LOCAL_CLUSTER_PAGE) if b.group == "sealed"]
    url = re.search(r"--from-literal=slack=(\S+)", code)
    written = re.search(r"> (\S+-sealed\.yaml)", code)
    assert url and written, code
    return url.group(1), written.group(1)


def test_the_pages_sealed_hook_url_is_unsealed_by_the_controller_alone(
    reallab: DevCluster,
) -> None:
    assert reallab.terminal is not None
    url, written = page_sealed()
    done = reallab.terminal.run(LOCAL_CLUSTER_PAGE, "sealed", timeout=120)
    assert done.returncode == 0, failed(done)
    sealed = (reallab.terminal.cwd / written).read_text()
    try:
        assert url not in sealed and base64.b64encode(url.encode()).decode() not in sealed
        assert unsealed(reallab, NAMESPACE, "alert-hooks") == {"slack": url}
    finally:
        (reallab.terminal.cwd / written).unlink()
        reallab.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                                       "alert-hooks")  # fmt: skip


def test_a_sealed_secret_opens_only_as_the_secret_it_was_sealed_for(reallab: DevCluster) -> None:
    """Strict scope: a tenant's SealedSecret applied in another tenant's namespace, or under
    another name, is refused (its namespace and name are in the ciphertext's label), and so is
    one whose ciphertext was changed; no Secret is made for any of them."""
    data = {"AWS_SECRET_ACCESS_KEY": "research-only-key"}
    moved = seal(reallab, TENANT, "research-s3", data)
    moved["metadata"]["namespace"] = OTHER_TENANT
    renamed = seal(reallab, TENANT, "research-s3", data)
    renamed["metadata"]["name"] = "renamed-s3"
    changed = seal(reallab, TENANT, "changed-s3", data)
    blob = base64.b64decode(changed["spec"]["encryptedData"]["AWS_SECRET_ACCESS_KEY"])
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    changed["spec"]["encryptedData"]["AWS_SECRET_ACCESS_KEY"] = base64.b64encode(flipped).decode()
    tried = [moved, renamed, changed]
    try:
        for doc in tried:
            apply(reallab, doc)
        for doc in tried:
            where = (doc["metadata"]["namespace"], doc["metadata"]["name"])
            assert "no key could decrypt secret" in refused(reallab, *where), where
            names = [s.metadata.name for s in reallab.core.list_namespaced_secret(where[0]).items]
            assert where[1] not in names, where
    finally:
        for doc in tried:
            meta = doc["metadata"]
            reallab.custom.delete_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"]
            )
