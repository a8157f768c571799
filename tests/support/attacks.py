"""The tenant attack matrix (issue 55, item 6): tenant A's user, through the API server with
the chart's own RoleBinding (the admin impersonating a member of A's group), tries what it must
not; each attempt is a row naming the layer expected to refuse it, the layer that did (read
from the refusal itself) and its message. tests/cluster/test_realnodes_attacks.py runs them
with the network and object store attacks, and writes the table."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from tests.support.devcluster import DevCluster

RBAC, POD_SECURITY_LAYER, VAP = "RBAC", "Pod Security", "ValidatingAdmissionPolicy"
KUEUE, NETPOL, KUBELET = "Kueue", "network policy", "kubelet"
OBJECT_STORE = "object store"
# The API server's own validation: it runs with --allow-privileged=false (devcluster/components)
NO_PRIVILEGED = "API server (--allow-privileged=false)"
DRY_RUN = "All"  # a create that is not refused (a hole) leaves nothing behind


@dataclass(frozen=True)
class Row:
    """One attack: what was tried, the layer expected to refuse it, the one that did ("" for
    none: it got through) and what it said."""

    attack: str
    expected: str
    refused_by: str
    message: str

    @property
    def held(self) -> bool:
        return self.refused_by == self.expected


def refusal(status: int, body: str) -> str:
    """The layer a refusal of the API server names (its status and message)."""
    if "ValidatingAdmissionPolicy" in body:
        return VAP
    if "violates PodSecurity" in body:
        return POD_SECURITY_LAYER
    if status == 422 and "privileged: Forbidden: disallowed by cluster policy" in body:
        return NO_PRIVILEGED
    if status == 403 and ("cannot " in body or "attempting to grant RBAC" in body):
        return RBAC
    return f"HTTP {status}"


def attempt(attack: str, expected: str, call: Callable[[], Any]) -> Row:
    """Run one API attack: the row says who refused it, or that nothing did."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        body = str(exc.body or exc.reason)
        return Row(attack, expected, refusal(exc.status, body), message_of(body))
    return Row(attack, expected, "", "allowed")


def message_of(body: str) -> str:
    """The API server's message from a Status body (its text, else the body), one line."""
    found = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', body)
    text = found.group(1).encode().decode("unicode_escape") if found else body
    return " ".join(text.split())[:240]


def impersonating(cluster: DevCluster, user: str, group: str) -> Any:
    """An ApiClient of the admin that acts as ``user`` in ``group`` (Impersonate-* headers):
    every request is authorized as that user, by the chart's RoleBinding of the group."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", group)
    return api


def raw(api: Any, method: str, path: str, query: list[tuple[str, str]] | None = None) -> Any:
    """A request the typed clients do not make (an exec's POST, a Job's deletion with its
    pods); an answer of 400 or more raised as the typed clients raise it."""
    from kubernetes.client.exceptions import ApiException

    method, url, headers, body, _ = api.param_serialize(
        method, path, query_params=query or [], auth_settings=["BearerToken"]
    )
    resp = api.call_api(method, url, header_params=headers, body=body)
    resp.read()
    if resp.status >= 400:
        raise ApiException(http_resp=resp)
    return resp


def pod(name: str, change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A pod that passes Pod Security restricted as the renderers make it, then ``change``d."""
    container = {"name": "c", "image": "localhost/gpufleet:cpu", "command": ["true"],
                 "securityContext": dict(CONTAINER_SECURITY)}  # fmt: skip
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [container], "securityContext": dict(POD_SECURITY)}}  # fmt: skip
    if change is not None:
        change(doc)
    return doc


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = doc["spec"]["containers"][0]
    return container


# Pod Security restricted's controls, each broken by one change of a restricted pod.
POD_ESCAPES: dict[str, Callable[[dict[str, Any]], None]] = {
    "a privileged container": lambda d: _container(d)["securityContext"].update(privileged=True),
    "a hostPath volume (the node's /)": lambda d: d["spec"].update(
        volumes=[{"name": "host", "hostPath": {"path": "/"}}]
    ),
    "hostNetwork": lambda d: d["spec"].update(hostNetwork=True),
    "hostPID": lambda d: d["spec"].update(hostPID=True),
    "hostIPC": lambda d: d["spec"].update(hostIPC=True),
    "capability NET_RAW": lambda d: _container(d)["securityContext"].update(
        capabilities={"drop": ["ALL"], "add": ["NET_RAW"]}
    ),
    "capability SYS_ADMIN": lambda d: _container(d)["securityContext"].update(
        capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    ),
    "running as root (runAsUser 0)": lambda d: d["spec"]["securityContext"].update(
        runAsNonRoot=False, runAsUser=0
    ),
}


def write_table(rows: list[Row], path: Path, context: list[str]) -> None:
    """The matrix as a Markdown table (attack, expected layer, refused by, message), after
    ``context`` (how it was made: versions, machine)."""
    lines = ["# Tenant attack matrix", "", *context, "",
             f"{sum(r.held for r in rows)} of {len(rows)} attacks refused by the layer expected.",
             "", "| # | attack | expected layer | refused by | message |",
             "|---:|---|---|---|---|"]  # fmt: skip
    for i, row in enumerate(rows, 1):
        message = row.message.replace("|", "\\|")
        lines.append(f"| {i} | {row.attack} | {row.expected} | {row.refused_by or 'NOT REFUSED'}"
                     f" | {message} |")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
