"""The API server's TokenReview and SubjectAccessReview, for the dashboard's in-process tests
(tests/unit/test_dashboard_auth.py): tokens of known users, and RBAC-like grants to users and
groups. The real ones answer in tests/cluster/test_devcluster_queues_fleet.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s


@dataclass(frozen=True)
class Grant:
    """``subject`` (a user, or "group:NAME") may ``verb`` ``resource`` ("pods/log" for a
    subresource) in ``namespace`` ("*": every namespace, and cluster-scoped ones)."""

    subject: str
    verb: str
    resource: str
    namespace: str = "*"
    group: str = ""


@dataclass
class FakeReviews:
    """AuthenticationV1Api.create_token_review and AuthorizationV1Api
    .create_subject_access_review, over ``tokens`` (token -> (user, groups)) and ``grants``."""

    tokens: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # "token" or "access NAMESPACE VERB RES"
    down: bool = False  # every review fails as an unreachable API server does

    def _check(self) -> None:
        if self.down:
            raise k8s.ApiException(status=503, reason="ServiceUnavailable")

    def create_token_review(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("token")
        self._check()
        known = self.tokens.get(body["spec"]["token"])
        if known is None:
            return {"status": {"authenticated": False, "error": "invalid bearer token"}}
        user, groups = known
        found = {"username": user, "uid": f"uid-{user}", "groups": groups}
        return {"status": {"authenticated": True, "user": found}}

    def create_subject_access_review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body["spec"]
        at = spec["resourceAttributes"]
        resource = at["resource"] + (f"/{at['subresource']}" if at.get("subresource") else "")
        ns = at.get("namespace", "")
        self.calls.append(f"access {ns} {at['verb']} {resource}")
        self._check()
        subjects = {spec["user"], *(f"group:{g}" for g in spec.get("groups", []))}
        allowed = any(
            g.subject in subjects and g.verb == at["verb"] and g.resource == resource
            and g.group == at.get("group", "") and g.namespace in ("*", ns or "*")
            for g in self.grants
        )  # fmt: skip
        return {"status": {"allowed": allowed}}
