"""The Kubernetes stand-in must not drift from kubernetes.client: every method it offers exists
on one of the real API classes with the same required positional parameters, and it answers
errors with the client's own ApiException."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.support.fake_kube import API_CLASSES, API_METHODS, FakeKube, required


@pytest.mark.parametrize("method", sorted(API_METHODS))
def test_every_method_is_the_real_clients(method: str) -> None:
    real = [
        getattr(getattr(k8s, c), method) for c in API_CLASSES if hasattr(getattr(k8s, c), method)
    ]
    assert real, f"no kubernetes.client API has {method}"
    assert required(getattr(FakeKube, method)) == required(real[0])


def test_a_view_offers_only_its_api_class_methods() -> None:
    kube = FakeKube()
    assert kube.api("AppsV1Api").create_namespaced_deployment
    with pytest.raises(AttributeError, match="PolicyV1Api has no method"):
        _ = kube.api("PolicyV1Api").create_namespaced_deployment


def test_errors_are_the_clients_api_exception() -> None:
    kube = FakeKube()
    with pytest.raises(k8s.ApiException) as info:
        kube.read_namespaced_deployment("absent", "ns")
    assert info.value.status == 404
    kube.create_namespaced_service("ns", {"metadata": {"name": "s"}, "kind": "Service"})
    with pytest.raises(k8s.ApiException) as info:
        kube.create_namespaced_service("ns", {"metadata": {"name": "s"}, "kind": "Service"})
    assert info.value.status == 409
    assert [name for name, _ in kube.calls] == ["read_namespaced_deployment"] + [
        "create_namespaced_service"
    ] * 2
