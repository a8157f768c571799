"""One stand-in for the Kubernetes API, for tests that have no cluster: an in-memory store of
objects behind the methods of kubernetes.client's CustomObjectsApi, CoreV1Api, AppsV1Api,
PolicyV1Api and AutoscalingV2Api that gpufleet calls, with the real clients' method names and
positional parameters (test_fake_kube checks them) and the real ApiException for errors.

One store plays every API, each through a view that offers only that API class's methods (a
call on the wrong client fails as it would for real): ``kube.cluster("team-a")``.
"""

from __future__ import annotations

import copy
import inspect
import json
from typing import Any

from kubernetes import client as k8s

from gpufleet.cluster import Cluster
from gpufleet.kube import Obj

Key = tuple[str, str, str, str, str]  # (group, version, namespace, plural, name)

# Built-in kinds by plural: (group, version, kind)
BUILTIN = {
    "pods": ("", "v1", "Pod"),
    "nodes": ("", "v1", "Node"),
    "services": ("", "v1", "Service"),
    "deployments": ("apps", "v1", "Deployment"),
    "poddisruptionbudgets": ("policy", "v1", "PodDisruptionBudget"),
    "horizontalpodautoscalers": ("autoscaling", "v2", "HorizontalPodAutoscaler"),
}
API_CLASSES = ("CustomObjectsApi", "CoreV1Api", "AppsV1Api", "PolicyV1Api", "AutoscalingV2Api")


REASONS = {403: "Forbidden", 404: "NotFound", 409: "AlreadyExists"}
# The API server's words for an update with an older resourceVersion (apiserver's
# storage.NewConflictError, seen on the local control plane).
CONFLICTED = ('Operation cannot be fulfilled on {} "{}": the object has been modified; please '
              "apply your changes to the latest version and try again")  # fmt: skip


def _terms(selector: str | None) -> list[tuple[str, str]]:
    return [(k, v) for k, _, v in (t.partition("=") for t in (selector or "").split(",") if t)]


def _matches(obj: Obj, label_selector: str | None, field_selector: str | None = None) -> bool:
    """Equality-based label and field selectors (``a=b,c=d``; fields as dotted paths), and a
    label's existence (``a``)."""
    labels = obj.get("metadata", {}).get("labels") or {}
    terms = (t.partition("=") for t in (label_selector or "").split(",") if t)
    if any(labels.get(k) != v if eq else k not in labels for k, eq, v in terms):
        return False
    for path, want in _terms(field_selector):
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value != want:
            return False
    return True


def required(fn: Any) -> list[str]:
    """A client method's required positional parameters (without self): what a stand-in for
    it must take in the same order."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [p.name for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]


class FakeKube:
    """A namespace's worth of API objects, events and pod logs, served like the API server."""

    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self.events: list[Obj] = []
        self.deleted: list[str] = []  # "Kind/name", in deletion order
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (client method, keyword arguments)
        self.fail_with: int | None = None  # every call raises ApiException(status) when set
        self.metrics: dict[str, str] = {}  # pod name -> what its metrics port serves
        # "plural.group" (core: "pods") -> the status a list of it gets: 404 for a kind whose
        # CRD is not installed, 403 for one the user may not list across namespaces (only
        # those lists are refused), any other for all
        self.refuse: dict[str, int] = {}

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name in API_METHODS:  # log each client call, as a recording proxy would

            def logged(*args: Any, **kwargs: Any) -> Any:
                object.__getattribute__(self, "calls").append((name, kwargs))
                return attr(*args, **kwargs)

            return logged
        return attr

    # -- filling and reading the store ---------------------------------------------------------

    def put(self, obj: Obj, namespace: str | None = None) -> None:
        """Store ``obj`` (a rendered or recorded API object) as the API server would."""
        group, _, version = obj["apiVersion"].rpartition("/")
        ns = namespace if namespace is not None else obj["metadata"].get("namespace", "")
        self.objects[(group, version, ns, _plural(obj["kind"]), obj["metadata"]["name"])] = obj

    def kinds(self) -> list[str]:
        """The kinds of the stored objects, in store order."""
        return [o["kind"] for o in self.objects.values()]

    def pods(self) -> list[Obj]:
        """The stored pods (the objects themselves: a test may change them)."""
        return [o for (_, _, _, p, _), o in self.objects.items() if p == "pods"]

    def called(self, method: str) -> list[dict[str, Any]]:
        """The keyword arguments of each call of ``method``, in order."""
        return [kwargs for name, kwargs in self.calls if name == method]

    def api(self, cls: str) -> ApiView:
        """This store as the kubernetes.client API class ``cls`` (e.g. "AppsV1Api")."""
        return ApiView(self, cls)

    def typed_apis(self) -> dict[str, Any]:
        """The typed APIs the cluster client takes by class name, as views of this store."""
        return {c: self.api(c) for c in ("AppsV1Api", "PolicyV1Api", "AutoscalingV2Api")}

    def cluster(self, namespace: str) -> Cluster:
        """gpufleet's Cluster client talking to this store in ``namespace``."""
        return Cluster(
            self.api("CustomObjectsApi"), self.api("CoreV1Api"), namespace, self.typed_apis()
        )

    def _check(self) -> None:
        if self.fail_with is not None:
            reason = REASONS.get(self.fail_with, "Injected")
            exc = k8s.ApiException(status=self.fail_with, reason=reason)
            # The body a real API server sends: a Status whose message says why (for 403, the
            # RBAC authorizer's words, as recorded on the local control plane).
            message = (
                'pods is forbidden: User "bob" cannot list resource "pods" in API group "" in '
                'the namespace "team-a"'
                if self.fail_with == 403
                else f"injected {reason}"
            )
            exc.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "message": message, "reason": reason,
                                   "code": self.fail_with})  # fmt: skip
            raise exc

    def _get(self, key: Key) -> Obj:
        self._check()
        if key not in self.objects:
            raise k8s.ApiException(status=404, reason=REASONS[404])
        return self.objects[key]

    def _create(self, key: Key, body: Obj) -> Obj:
        self._check()
        if key in self.objects:
            raise k8s.ApiException(status=409, reason=REASONS[409])
        self.objects[key] = copy.deepcopy(body)
        return body

    def _delete(self, key: Key) -> None:
        obj = self._get(key)
        del self.objects[key]
        self.deleted.append(f"{obj['kind']}/{key[4]}")

    def _list(
        self, group: str, version: str, namespace: str | None, plural: str, kw: dict[str, Any]
    ) -> list[Obj]:
        self._check()
        refused = self.refuse.get(f"{plural}.{group}".rstrip("."))
        if refused is not None and (refused != 403 or namespace is None):
            raise k8s.ApiException(status=refused, reason=REASONS.get(refused, "Injected"))
        return [
            o for (g, v, ns, p, _), o in self.objects.items()
            if (g, v, p) == (group, version, plural) and namespace in (None, ns)
            and _matches(o, kw.get("label_selector"), kw.get("field_selector"))
        ]  # fmt: skip

    def _builtin(self, plural: str, namespace: str, name: str) -> Key:
        group, version, _ = BUILTIN[plural]
        return (group, version, namespace, plural, name)

    # -- CustomObjectsApi ---------------------------------------------------------------------

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **_: Any
    ) -> Obj:
        return self._get((group, version, namespace, plural, name))

    def get_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, **_: Any
    ) -> Obj:
        return self._get((group, version, "", plural, name))

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **kw: Any
    ) -> Obj:
        return {"items": self._list(group, version, namespace, plural, kw)}

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kw: Any) -> Obj:
        """A cluster-scoped kind's objects, or a namespaced kind's in every namespace."""
        return {"items": self._list(group, version, None, plural, kw)}

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Obj, **_: Any
    ) -> Obj:
        return self._create((group, version, namespace, plural, body["metadata"]["name"]), body)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **_: Any
    ) -> Obj:
        self._delete((group, version, namespace, plural, name))
        return {"status": "Success"}

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Obj,
        **_: Any,
    ) -> Obj:  # fmt: skip
        """A JSON merge patch (the client's default for a dict body); a resourceVersion in it
        that is not the stored one is the API server's 409 Conflict."""
        obj = self._get((group, version, namespace, plural, name))
        given = (body.get("metadata") or {}).get("resourceVersion")
        if given is not None and given != obj["metadata"].get("resourceVersion"):
            exc = k8s.ApiException(status=409, reason="Conflict")
            said = CONFLICTED.format(f"{plural}.{group}", name)
            exc.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Conflict",
                                   "code": 409, "message": said})  # fmt: skip
            raise exc
        _merge(obj, body)
        obj["metadata"]["resourceVersion"] = str(
            int(obj["metadata"].get("resourceVersion") or 0) + 1
        )
        return obj

    # -- CoreV1Api ----------------------------------------------------------------------------

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Obj:
        pods = self._list("", "v1", namespace, "pods", kw)
        return {"items": sorted(pods, key=lambda p: p["metadata"]["name"])}

    def list_pod_for_all_namespaces(self, **kw: Any) -> k8s.V1PodList:
        """Typed models, as the real client returns them (the exporter reads attributes)."""
        pods = sorted(self._list("", "v1", None, "pods", kw), key=lambda p: p["metadata"]["name"])
        return k8s.V1PodList(items=[k8s.V1Pod.from_dict(_complete(p)) for p in pods])

    def list_node(self, **kw: Any) -> Obj:
        return {"items": self._list("", "v1", None, "nodes", kw)}

    def list_namespaced_event(self, namespace: str, **kw: Any) -> Obj:
        self._check()
        return {
            "items": [
                e
                for e in self.events
                if _matches(e, None, kw.get("field_selector"))
                and e.get("metadata", {}).get("namespace", namespace) == namespace
            ]
        }

    def list_event_for_all_namespaces(self, **kw: Any) -> Obj:
        self._check()
        return {"items": [e for e in self.events if _matches(e, None, kw.get("field_selector"))]}

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> str:
        self._get(self._builtin("pods", namespace, name))
        lines = [f"{name} line {i}" for i in range(5)]
        tail = kw.get("tail_lines")
        return "\n".join(lines[-tail:] if tail else lines)

    def connect_get_namespaced_pod_proxy_with_path(
        self, name: str, namespace: str, path: str, **_: Any
    ) -> str:
        """``name`` is ``pod:port``; a pod with nothing in ``metrics`` does not answer (the
        API server's 503, as for a port nothing listens on)."""
        self._check()
        pod = name.partition(":")[0]
        self._get(self._builtin("pods", namespace, pod))
        if path != "metrics" or pod not in self.metrics:
            raise k8s.ApiException(status=503, reason="ServiceUnavailable")
        return self.metrics[pod]

    def create_namespaced_service(self, namespace: str, body: Obj, **_: Any) -> Obj:
        return self._create(self._builtin("services", namespace, body["metadata"]["name"]), body)

    def list_namespaced_service(self, namespace: str, **kw: Any) -> Obj:
        return {"items": self._list("", "v1", namespace, "services", kw)}

    def delete_namespaced_service(self, name: str, namespace: str, **_: Any) -> Obj:
        self._delete(self._builtin("services", namespace, name))
        return {"status": "Success"}

    # -- AppsV1Api, PolicyV1Api, AutoscalingV2Api -----------------------------------------------

    def create_namespaced_deployment(self, namespace: str, body: Obj, **_: Any) -> Obj:
        return self._create(self._builtin("deployments", namespace, body["metadata"]["name"]), body)

    def list_namespaced_deployment(self, namespace: str, **kw: Any) -> Obj:
        return {"items": self._list("apps", "v1", namespace, "deployments", kw)}

    def list_deployment_for_all_namespaces(self, **kw: Any) -> Obj:
        return {"items": self._list("apps", "v1", None, "deployments", kw)}

    def list_namespaced_horizontal_pod_autoscaler(self, namespace: str, **kw: Any) -> Obj:
        return {"items": self._list("autoscaling", "v2", namespace, "horizontalpodautoscalers", kw)}

    def list_horizontal_pod_autoscaler_for_all_namespaces(self, **kw: Any) -> Obj:
        return {"items": self._list("autoscaling", "v2", None, "horizontalpodautoscalers", kw)}

    def read_namespaced_deployment(self, name: str, namespace: str, **_: Any) -> Obj:
        return self._get(self._builtin("deployments", namespace, name))

    def delete_namespaced_deployment(self, name: str, namespace: str, **_: Any) -> Obj:
        self._delete(self._builtin("deployments", namespace, name))
        return {"status": "Success"}

    def create_namespaced_pod_disruption_budget(self, namespace: str, body: Obj, **_: Any) -> Obj:
        key = self._builtin("poddisruptionbudgets", namespace, body["metadata"]["name"])
        return self._create(key, body)

    def delete_namespaced_pod_disruption_budget(self, name: str, namespace: str, **_: Any) -> Obj:
        self._delete(self._builtin("poddisruptionbudgets", namespace, name))
        return {"status": "Success"}

    def create_namespaced_horizontal_pod_autoscaler(
        self, namespace: str, body: Obj, **_: Any
    ) -> Obj:
        key = self._builtin("horizontalpodautoscalers", namespace, body["metadata"]["name"])
        return self._create(key, body)

    def delete_namespaced_horizontal_pod_autoscaler(
        self, name: str, namespace: str, **_: Any
    ) -> Obj:
        self._delete(self._builtin("horizontalpodautoscalers", namespace, name))
        return {"status": "Success"}


# The client methods FakeKube implements: every public method but the store's own helpers.
API_METHODS = frozenset(
    name for name in vars(FakeKube)
    if not name.startswith("_")
    and name not in {"put", "kinds", "pods", "called", "api", "typed_apis", "cluster"}
)  # fmt: skip


def _merge(target: Obj, patch: Obj) -> None:
    """RFC 7386: objects merge key by key, null removes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class ApiView:
    """One kubernetes.client API class over a FakeKube: only that class's methods exist."""

    def __init__(self, kube: FakeKube, cls: str) -> None:
        self.kube, self.cls = kube, cls

    def __getattr__(self, name: str) -> Any:
        if not hasattr(getattr(k8s, self.cls), name):
            raise AttributeError(f"kubernetes.client.{self.cls} has no method {name}")
        return getattr(self.kube, name)


def _complete(pod: Obj) -> Obj:
    """A recorded pod with the fields it was trimmed of that the API server always sends and
    the client's typed model requires (its containers, their statuses' image and readiness)."""
    pod = copy.deepcopy(pod)
    if pod.get("spec") is not None:
        pod["spec"].setdefault("containers", [])
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for key, value in (("image", ""), ("imageID", ""), ("ready", False), ("restartCount", 0)):
            status.setdefault(key, value)
    return pod


def _plural(kind: str) -> str:
    plural = next((p for p, (_, _, k) in BUILTIN.items() if k == kind), None)
    return plural or kind.lower() + "s"
