"""Who is looking, and what they may see (``gpufleet dashboard --auth token``; the chart's
deployment, docs/cluster.md "In a browser").

A viewer brings a Kubernetes bearer token: an ``Authorization: Bearer`` header, or the cookie
that the login page sets (HttpOnly, SameSite=Strict). The API server says whose it is
(TokenReview) and what that user may read (SubjectAccessReview), as KueueViz's authentication
(Kueue KEP-5993) and the Kubernetes Dashboard check theirs. The dashboard reads the cluster with
its own ServiceAccount and shows each viewer only what they could read themselves:

- a namespace's jobs, workloads, events, services and GPUs: ``list pods`` there;
- a job's logs and curves: ``get pods/log`` there;
- the nodes, and the ClusterQueues: ``list`` them;
- the local runs and the history (which name no namespace): ``list pods`` in every namespace.

Reviews are reused for ``ACCEPTED_S`` (a refused token's for ``REFUSED_S``), so a page's refresh
costs the API server no review; a revoked token is refused within that time. Tokens are kept
only as their SHA-256, and never logged. Starlette's AuthenticationMiddleware runs the check
(TokenBackend); each page asks for the "viewer" scope.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
)
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gpufleet.cluster.apierrors import api_errors, to_cluster_error
from gpufleet.errors import GpufleetError

TOKEN_COOKIE = "gpufleet_token"
SCOPE = "viewer"
ACCEPTED_S = 60.0
REFUSED_S = 5.0
OPEN = ("/login", "/logout", "/healthz")  # the pages anyone may reach


@dataclass(frozen=True)
class Access:
    """What a SubjectAccessReview asks: may the user ``verb`` ``resource`` (in ``namespace``;
    "" is every namespace, or a cluster-scoped resource)."""

    verb: str
    resource: str
    group: str = ""
    namespace: str = ""
    subresource: str = ""

    def attributes(self) -> dict[str, str]:
        out = {"verb": self.verb, "resource": self.resource, "group": self.group,
               "namespace": self.namespace, "subresource": self.subresource}  # fmt: skip
        return {k: v for k, v in out.items() if v}


NODES = Access("list", "nodes")
CLUSTER_QUEUES = Access("list", "clusterqueues", "kueue.x-k8s.io")


def pods_in(namespace: str) -> Access:
    """A namespace's read: its pods (every namespace's, for "")."""
    return Access("list", "pods", namespace=namespace)


def logs_in(namespace: str) -> Access:
    return Access("get", "pods", namespace=namespace, subresource="log")


class Viewer(BaseUser):
    """A person looking at the dashboard; ``allowed`` answers their access reviews (None: no
    authentication, so everything the dashboard reads)."""

    def __init__(self, name: str, allowed: Callable[[Access], bool] | None = None) -> None:
        self.name, self._allowed = name, allowed

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.name

    def may(self, access: Access) -> bool:
        return self._allowed is None or self._allowed(access)

    def may_read(self, namespace: str) -> bool:
        """Whether the namespace's jobs and what they hold are shown: every namespace is, to one
        who may list pods in all of them (one review, not one per namespace)."""
        return self.may(pods_in("")) or self.may(pods_in(namespace))

    @property
    def everywhere(self) -> bool:
        return self.may(pods_in(""))


ANYONE = Viewer("")  # the dashboard on 127.0.0.1, with no authentication: its user's kubeconfig


class Reviews:
    """The API server's answers on tokens and access, kept for a while; safe across threads."""

    def __init__(
        self, authentication: Any, authorization: Any, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.authentication, self.authorization = authentication, authorization
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[object, tuple[float, Any]] = {}

    def _cached(self, key: object, ask: Callable[[], Any], keep: Callable[[Any], float]) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        answer = ask()
        with self._lock:
            self._kept = {k: v for k, v in self._kept.items() if v[0] > now}  # forget the old
            self._kept[key] = (now + keep(answer), answer)
        return answer

    def viewer(self, token: str) -> Viewer | None:
        """The token's user, or None when the API server does not accept it."""
        key = ("token", hashlib.sha256(token.encode()).hexdigest())
        user = self._cached(key, lambda: self._review(token),
                            lambda u: ACCEPTED_S if u else REFUSED_S)  # fmt: skip
        if user is None:
            return None
        return Viewer(str(user.get("username", "")), lambda access: self.allowed(user, access))

    def _review(self, token: str) -> dict[str, Any] | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}  # fmt: skip
        try:
            status = self.authentication.create_token_review(body).get("status") or {}
        except api_errors() as exc:
            raise to_cluster_error(exc, "review a viewer's token (TokenReview)") from exc
        user: dict[str, Any] | None = status.get("user")
        return user if status.get("authenticated") and user else None

    def allowed(self, user: dict[str, Any], access: Access) -> bool:
        """Whether ``user`` (a TokenReview's) may do ``access``."""
        key = ("access", user.get("uid"), user.get("username"), access)
        return bool(self._cached(key, lambda: self._access(user, access), lambda _: ACCEPTED_S))

    def _access(self, user: dict[str, Any], access: Access) -> bool:
        spec = {"user": user.get("username", ""), "groups": user.get("groups") or [],
                "resourceAttributes": access.attributes()}  # fmt: skip
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": spec}  # fmt: skip
        try:
            answer = self.authorization.create_subject_access_review(body)
        except api_errors() as exc:
            raise to_cluster_error(exc, "review a viewer's access (SubjectAccessReview)") from exc
        return bool((answer.get("status") or {}).get("allowed"))


def token_of(conn: HTTPConnection) -> tuple[str, str] | None:
    """The request's token and where it came from ("header" or "cookie")."""
    scheme, _, token = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip(), "header"
    cookie = conn.cookies.get(TOKEN_COOKIE, "")
    return (cookie, "cookie") if cookie else None


class Refused(AuthenticationError):
    """A token the API server did not accept; ``source`` is where the request carried it."""

    def __init__(self, source: str) -> None:
        super().__init__("the token was not accepted (TokenReview): sign in again")
        self.source = source


class Unreachable(AuthenticationError):
    """The API server could not review a token (unreachable, or the dashboard may not ask)."""


class TokenBackend(AuthenticationBackend):
    """Starlette's authentication step: every request's viewer (``request.user``)."""

    def __init__(self, reviews: Reviews | None) -> None:
        self.reviews = reviews

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        if self.reviews is None:
            return AuthCredentials([SCOPE]), ANYONE
        path = conn.url.path
        if path in OPEN or path.startswith("/static/"):
            return None  # signing in, with a stale cookie, must not need the cookie
        found = token_of(conn)
        if found is None:
            return None  # the login page, for a page that asks for a viewer
        try:
            viewer = await run_in_threadpool(self.reviews.viewer, found[0])
        except GpufleetError as exc:
            raise Unreachable(str(exc)) from exc
        if viewer is None:
            raise Refused(found[1])
        return AuthCredentials([SCOPE]), viewer
