"""cluster/builtin.py's calls are the typed kubernetes.client methods' own: the same names and
positional parameters, the same HTTP requests to a server on 127.0.0.1 (verb, path, query,
body), its JSON answered as dicts and its refusals as the client's ApiException. And the
cluster commands no longer import the typed API modules (their cost, 1.3 CPU-s a command)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client as k8s

from gpufleet.cluster.builtin import CALLS, BuiltinApi
from tests.support.fake_kube import required

Request = tuple[str, str, bytes]  # (verb, path with query, body)
META = {"name": "w-0", "namespace": "team", "labels": {"app": "w"}}
TEMPLATE = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c"}]}}
# What each resource's calls send and are answered: an object the typed client's models take.
OBJECTS = {
    "pods": {"apiVersion": "v1", "kind": "Pod", "metadata": META},
    "services": {"apiVersion": "v1", "kind": "Service", "metadata": META},
    "events": {"apiVersion": "v1", "kind": "Event", "metadata": META,
               "involvedObject": {"kind": "Pod", "name": "w-0"}},
    "namespaces": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w-0"}},
    "nodes": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-0"}},
    "deployments": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": META, "spec": {
        "selector": {"matchLabels": {"app": "w"}}, "template": TEMPLATE}},
    "poddisruptionbudgets": {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                             "metadata": META},
    "horizontalpodautoscalers": {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                                 "metadata": META, "spec": {"maxReplicas": 2, "scaleTargetRef": {
                                     "apiVersion": "apps/v1", "kind": "Deployment", "name": "w"}}},
    "tokenreviews": {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                     "spec": {"token": "t0ken"}},
    "subjectaccessreviews": {"apiVersion": "authorization.k8s.io/v1", "kind":
                             "SubjectAccessReview", "spec": {"user": "dana", "resourceAttributes":
                             {"namespace": "team", "verb": "list", "resource": "pods"}}},
}  # fmt: skip
LOG = "step 10 loss 0.5\n"


def answer(verb: str, path: str) -> tuple[int, str, Any]:
    """(status, content type, body) the API server would give for ``verb path``."""
    parts = path.split("?")[0].strip("/").split("/")
    if "gone" in parts:
        return 404, "application/json", {"kind": "Status", "code": 404,
                                         "message": 'pods "gone" not found'}  # fmt: skip
    if parts[-1] in ("log", "metrics"):
        return 200, "text/plain; charset=utf-8", LOG
    at = parts.index("namespaces") + 2 if "namespaces" in parts[:-1] else len(parts) - 1
    plural = parts[at] if at < len(parts) else "namespaces"
    if verb == "DELETE" and plural not in ("pods", "services"):  # those answer the object
        return 200, "application/json", {"apiVersion": "v1", "kind": "Status", "status": "Success"}
    if verb == "GET" and len(parts) == at + 1:  # a list
        return 200, "application/json", {"kind": "List", "metadata": {}, "items": [OBJECTS[plural]]}
    return 200, "application/json", OBJECTS[plural]


class Recorder(BaseHTTPRequestHandler):
    """Records each request and gives ``answer``'s."""

    seen: ClassVar[list[Request]] = []

    def _answer(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        self.seen.append((self.command, self.path, self.rfile.read(size)))
        status, kind, body = answer(self.command, self.path)
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def api_client() -> Iterator[k8s.ApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    with k8s.ApiClient(config) as client:
        yield client
    server.shutdown()
    server.server_close()


ARGS = {"name": "w-0", "namespace": "team", "path": "metrics"}
KWARGS = {  # by operation, or by method
    "list": {"label_selector": "gpufleet.dev/job=w"},
    "create": {"field_validation": "Strict"},
    "delete": {"grace_period_seconds": 0},
    "read_namespaced_pod_log": {"tail_lines": 5},
}
METHODS = sorted((api, method) for api, calls in CALLS.items() for method in calls)


def sent(api_client: k8s.ApiClient, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Request:
    Recorder.seen.clear()
    fn(*args, **kwargs)
    (request,) = Recorder.seen
    verb, path, body = request
    return verb, path, json.dumps(json.loads(body), sort_keys=True).encode() if body else b""


@pytest.mark.parametrize(("api", "method"), METHODS)
def test_each_call_sends_what_the_typed_client_sends(
    api_client: k8s.ApiClient, api: str, method: str
) -> None:
    call, typed = CALLS[api][method], getattr(getattr(k8s, api)(api_client), method)
    assert required(getattr(type(typed.__self__), method)) == list(call.positional)
    plural = call.path.removesuffix("/{name}").split("/")[-1]
    args = [ARGS.get(p, OBJECTS.get(plural)) for p in call.positional]
    kwargs = KWARGS.get(method, KWARGS.get(method.split("_")[0], {}))
    ours = sent(api_client, getattr(BuiltinApi(api_client, api), method), args, kwargs)
    assert ours == sent(api_client, typed, args, kwargs)
    assert ours[0] == call.verb


def test_answers_are_the_apis_json_its_text_and_its_refusals(api_client: k8s.ApiClient) -> None:
    core = BuiltinApi(api_client, "CoreV1Api")
    # dicts, as CustomObjectsApi answers
    assert core.read_namespaced_pod("w-0", "team") == OBJECTS["pods"]
    assert core.read_namespaced_pod_log("w-0", "team", tail_lines=5) == LOG
    assert core.connect_get_namespaced_pod_proxy_with_path("w-0", "team", "metrics") == LOG
    with pytest.raises(k8s.ApiException) as refused:
        core.read_namespaced_pod("gone", "team")
    assert refused.value.status == 404 and 'pods \\"gone\\" not found' in str(refused.value.body)


def test_a_method_of_another_api_or_missing_parameters_fail_as_on_the_typed_client(
    api_client: k8s.ApiClient,
) -> None:
    with pytest.raises(AttributeError, match="AppsV1Api has no method list_namespaced_pod"):
        BuiltinApi(api_client, "AppsV1Api").list_namespaced_pod  # noqa: B018
    with pytest.raises(TypeError, match="takes name, namespace"):
        BuiltinApi(api_client, "CoreV1Api").read_namespaced_pod("w-0")


def test_the_cluster_commands_import_no_typed_api_module() -> None:
    """Cluster.of and a call on each API: only CustomObjectsApi's module is imported (on the
    old code CoreV1Api's and three more, 1.3 CPU-s in every cluster command)."""
    code = (
        "import sys\n"
        "from kubernetes.client import ApiClient\n"
        "from gpufleet.cluster.client import Cluster\n"
        "c = Cluster.of(ApiClient(), 'team')\n"
        "[getattr(c.apis[n], m) for n, m in (('CoreV1Api', 'list_namespaced_pod'),"
        " ('AppsV1Api', 'read_namespaced_deployment'))]\n"
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes.client.api.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['kubernetes.client.api.custom_objects_api']", done.stdout
