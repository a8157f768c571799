"""The built-in APIs' calls the cluster commands make (pods, services, events, namespaces,
nodes, Deployments, PodDisruptionBudgets, HorizontalPodAutoscalers, and the dashboard's
TokenReviews and SubjectAccessReviews), through the kubernetes client's
own ApiClient: its kubeconfig, authentication, TLS, request building and ApiException. They
answer the API's JSON as dicts, as CustomObjectsApi does.

Why not kubernetes.client.CoreV1Api and its siblings: in kubernetes 37 each typed API class is
a generated module that builds pydantic validators for every method of its group when it is
first used. CoreV1Api alone is 4.4 MB of source and 1.0 CPU-s; the four gpufleet used were
1.3 of the 2.3 CPU-s of every `gpufleet status`, `logs`, `submit` and `cancel`. Only those
per-method wrappers are left out: each method here has the typed method's name and positional
parameters (tests/unit/test_cluster_builtin.py checks both against the client), so the same
calls, and tests/support/fake_kube.py, serve either.
"""

from __future__ import annotations

from typing import Any

# API class -> (its path prefix, {resource in a method name: (plural, operations)}). The
# operations' methods are ``<op>_namespaced_<resource>`` with the client's positional
# parameters: list (namespace), read and delete (name, namespace), create (namespace, body).
RESOURCES: dict[str, tuple[str, dict[str, tuple[str, tuple[str, ...]]]]] = {
    "CoreV1Api": ("/api/v1", {
        "pod": ("pods", ("list", "read", "create", "delete")),
        "service": ("services", ("list", "create", "delete")),
        "event": ("events", ("list",)),
    }),
    "AppsV1Api": ("/apis/apps/v1", {
        "deployment": ("deployments", ("list", "read", "create", "delete")),
    }),
    "PolicyV1Api": ("/apis/policy/v1", {
        "pod_disruption_budget": ("poddisruptionbudgets", ("create", "delete")),
    }),
    "AutoscalingV2Api": ("/apis/autoscaling/v2", {
        "horizontal_pod_autoscaler": ("horizontalpodautoscalers", ("list", "create", "delete")),
    }),
}  # fmt: skip
# Lists across every namespace (the fleet's, gpufleet jobs -A), and of the cluster's nodes.
WHOLE_CLUSTER = {
    "CoreV1Api": {"list_pod_for_all_namespaces": "/api/v1/pods",
                  "list_event_for_all_namespaces": "/api/v1/events", "list_node": "/api/v1/nodes"},
    "AppsV1Api": {"list_deployment_for_all_namespaces": "/apis/apps/v1/deployments"},
    "AutoscalingV2Api": {"list_horizontal_pod_autoscaler_for_all_namespaces":
                         "/apis/autoscaling/v2/horizontalpodautoscalers"},
}  # fmt: skip
POSITIONAL = {"list": ("namespace",), "read": ("name", "namespace"),
              "create": ("namespace", "body"), "delete": ("name", "namespace")}  # fmt: skip
VERBS = {"list": "GET", "read": "GET", "create": "POST", "delete": "DELETE"}


class Call:
    """One API method: HTTP verb, path template, positional parameters and what it answers
    ("object": the JSON as dicts, "str": the text, as a pod's log)."""

    def __init__(self, verb: str, path: str, positional: tuple[str, ...], answer: str = "object"):
        self.verb, self.path, self.positional, self.answer = verb, path, positional, answer


def _calls() -> dict[str, dict[str, Call]]:
    calls: dict[str, dict[str, Call]] = {}
    for api, (prefix, resources) in RESOURCES.items():
        mine = calls.setdefault(api, {})
        for resource, (plural, operations) in resources.items():
            for op in operations:
                path = f"{prefix}/namespaces/{{namespace}}/{plural}"
                path += "/{name}" if "name" in POSITIONAL[op] else ""
                mine[f"{op}_namespaced_{resource}"] = Call(VERBS[op], path, POSITIONAL[op])
    for api, lists in WHOLE_CLUSTER.items():
        calls[api].update({method: Call("GET", path, ()) for method, path in lists.items()})
    pod = "/api/v1/namespaces/{namespace}/pods/{name}"
    calls["CoreV1Api"].update({
        "read_namespace": Call("GET", "/api/v1/namespaces/{name}", ("name",)),
        "read_namespaced_pod_log": Call("GET", f"{pod}/log", ("name", "namespace"), "str"),
        "connect_get_namespaced_pod_proxy_with_path": Call(
            "GET", f"{pod}/proxy/{{path}}", ("name", "namespace", "path"), "str"),
    })  # fmt: skip
    # The dashboard's check of a viewer's token and of what its user may read (--auth token).
    calls["AuthenticationV1Api"] = {"create_token_review": Call(
        "POST", "/apis/authentication.k8s.io/v1/tokenreviews", ("body",))}  # fmt: skip
    calls["AuthorizationV1Api"] = {"create_subject_access_review": Call(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", ("body",))}  # fmt: skip
    return calls


CALLS = _calls()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class BuiltinApi:
    """The methods of one typed API class (``CoreV1Api``, ...) that gpufleet calls; any other
    is an AttributeError, as on the wrong client."""

    def __init__(self, api_client: Any, api: str) -> None:
        self.api_client = api_client  # a kubernetes.client.ApiClient
        self.api = api

    def __getattr__(self, method: str) -> Any:
        call = CALLS[self.api].get(method)
        if call is None:
            raise AttributeError(f"kubernetes.client.{self.api} has no method {method} here")

        def bound(*args: Any, **kwargs: Any) -> Any:
            return self._send(call, args, kwargs)

        return bound

    def _send(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        given = dict(zip(call.positional, args, strict=False))
        given.update({k: kwargs.pop(k) for k in call.positional if k in kwargs})
        if len(args) > len(call.positional) or len(given) < len(call.positional):
            raise TypeError(f"{self.api}: takes {', '.join(call.positional)}, got {args}")
        body = given.pop("body", None) if call.verb == "POST" else kwargs.pop("body", None)
        timeout = kwargs.pop("_request_timeout", None)
        preload = kwargs.pop("_preload_content", True)  # False: a watch reads the stream
        client = self.api_client
        headers = {"Accept": "application/json" if call.answer == "object" else "*/*"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = client.param_serialize(
            method=call.verb, resource_path=call.path, path_params=given,
            query_params=[(_camel(k), v) for k, v in kwargs.items() if v is not None],
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )  # fmt: skip
        response = client.call_api(*request, _request_timeout=timeout)
        if not preload:  # a watch: kubernetes.watch.Watch reads the raw response's lines
            if not 200 <= response.status <= 299:  # (gpufleet.cluster.watchcache)
                from kubernetes.client.exceptions import ApiException

                response.read()
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return response.response
        response.read()
        types = {"2XX": call.answer}
        return client.response_deserialize(response_data=response, response_types_map=types).data
