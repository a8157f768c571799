"""The kubernetes client's errors, translated in one place for ``cluster`` and ``devcluster``:
which exceptions are the cluster's answer (``api_errors``), its HTTP status and its own words,
and one line saying what we were doing and what the API server said (``to_cluster_error``)."""

from __future__ import annotations

import json
from functools import cache

from gpufleet.errors import ClusterError

# What a status means to someone who ran a gpufleet command.
REASONS = {
    401: "unauthorized (expired or unknown credentials: renew the kubeconfig)",
    403: "forbidden",
    404: "not found (is the operator's CRD installed?)",
    409: "already exists (gpufleet cancel it first)",
    422: "rejected as invalid",
}
# A 409 whose Status says Conflict, not AlreadyExists: an update that carried an older
# resourceVersion than the stored object's (Kubernetes' optimistic concurrency).
CONFLICT = "changed since it was read (a newer version is stored; read it again)"


@cache
def api_errors() -> tuple[type[Exception], ...]:
    """What the kubernetes client raises when the cluster says no or cannot be reached: its
    ApiException (with the HTTP status) and urllib3's transport errors. Anything else is a bug
    of ours and propagates with its traceback instead of posing as a cluster error."""
    try:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError
    except ImportError:  # no client installed: nothing can raise its errors
        return ()
    return (ApiException, HTTPError)


def status_code(exc: Exception) -> int | None:
    """The API server's HTTP status; None when it was never reached (a transport error)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def status_field(exc: Exception, field: str) -> str:
    """A field of the API server's Status body (``message``, ``reason``), or ""."""
    body = getattr(exc, "body", "") or ""
    try:
        return str(json.loads(body).get(field, "") or "") if body else ""
    except (ValueError, AttributeError):
        return ""


def server_message(exc: Exception) -> str:
    """The API server's own words: the ``message`` of its Status body (one line), else the
    body or reason as given."""
    body = getattr(exc, "body", "") or ""
    text = str(status_field(exc, "message") or body or getattr(exc, "reason", "") or "")
    return " ".join(text.split())[:500]


def to_cluster_error(exc: Exception, doing: str) -> ClusterError:
    """The client's error as one line: what we were doing and what the API server said."""
    code = status_code(exc)
    if code is None:
        return ClusterError(f"{doing}: cannot reach the API server: {exc}")
    detail = server_message(exc)
    what = REASONS.get(code, f"HTTP {code}")
    if code == 403 and " cannot " in detail:
        what = "forbidden (RBAC)"
    if code == 409 and status_field(exc, "reason") == "Conflict":
        what = CONFLICT
    return ClusterError(f"{doing}: {what}: {detail}" if detail else f"{doing}: {what}")
