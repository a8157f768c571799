"""The dashboard's shared watch cache (gpufleet.cluster.watchcache) on the real API server: a
whole-cluster list is listed once and then follows the cluster through its watch (a pod made,
changed and deleted; a custom object too), its selectors are the API server's, reads of one
object go to the API server, and a list the caller may not make fails as it would uncached.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpufleet.cluster.builtin import BuiltinApi
from gpufleet.cluster.watchcache import FIRST_LIST_S, Cached
from tests.support.devcluster import DevCluster, needs_controlplane, tenant_user
from tests.support.procs import poll_until

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
NS, LABEL = "default", "watchcache-test"


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {LABEL: "yes"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip


@pytest.fixture
def cached(devcluster: DevCluster) -> Iterator[tuple[Cached, Cached]]:
    core, custom = Cached(BuiltinApi(devcluster.api, "CoreV1Api")), Cached(devcluster.custom)
    try:
        yield core, custom
    finally:
        core.close()
        custom.close()
        for name in ("w-a", "w-b"):
            with contextlib.suppress(ApiException):
                devcluster.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def mine_now(core: Cached) -> list[Any]:
    return list(core.list_pod_for_all_namespaces(label_selector=LABEL)["items"])


def names(found: dict[str, Any]) -> set[str]:
    return {o["metadata"]["name"] for o in found["items"]}


def test_a_list_is_made_once_then_follows_the_cluster(
    devcluster: DevCluster, cached: tuple[Cached, Cached]
) -> None:
    core = cached[0]
    devcluster.core.create_namespaced_pod(NS, pod("w-a"))
    mine = core.list_pod_for_all_namespaces(label_selector=LABEL)
    assert names(mine) == {"w-a"}
    devcluster.core.create_namespaced_pod(NS, pod("w-b"))
    poll_until(lambda: names(core.list_pod_for_all_namespaces(label_selector=LABEL)) ==
               {"w-a", "w-b"}, what="the new pod in the cache", timeout=30)  # fmt: skip
    devcluster.core.patch_namespaced_pod("w-a", NS, {"metadata": {"annotations": {"x": "1"}}})
    poll_until(lambda: any((o["metadata"].get("annotations") or {}).get("x") == "1"
                           for o in mine_now(core)), what="the change in the cache",
               timeout=30)  # fmt: skip
    devcluster.core.delete_namespaced_pod("w-a", NS, grace_period_seconds=0)
    poll_until(lambda: "w-a" not in names(core.list_pod_for_all_namespaces(label_selector=LABEL)),
               what="the deleted pod gone from the cache", timeout=60)  # fmt: skip
    (store,) = core.stores()
    assert store.lists == 1 and store.fresh()  # every change came by the watch
    everything = core.list_pod_for_all_namespaces()  # another call: a store of its own
    assert len(core.stores()) == 2 and "w-b" in names(everything)
    assert core.read_namespaced_pod("w-b", NS)["metadata"]["name"] == "w-b"  # not cached


def test_custom_objects_are_cached_the_same_way(
    devcluster: DevCluster, cached: tuple[Cached, Cached]
) -> None:
    custom = cached[1]
    queues = custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues")
    direct = devcluster.custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                          "clusterqueues")  # fmt: skip
    assert names(queues) == names(direct)
    assert custom.stores()[0].lists == 1


def test_a_list_the_caller_may_not_make_fails_as_uncached(devcluster: DevCluster) -> None:
    from kubernetes import config

    env = tenant_user(devcluster, "watchcache-viewer", "nobody")
    client = config.new_client_from_config(config_file=env["KUBECONFIG"])
    core = Cached(BuiltinApi(client, "CoreV1Api"))
    try:
        started = time.monotonic()
        with pytest.raises(ApiException) as refused:
            core.list_node()
        assert refused.value.status == 403
        assert time.monotonic() - started < FIRST_LIST_S  # not held until the store gives up
        (store,) = core.stores()
        assert not store.fresh() and store.error is not None
    finally:
        core.close()
