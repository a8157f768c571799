"""``gpufleet dashboard``: the fleet and the local runs in a browser, read-only, on 127.0.0.1
unless told otherwise."""

from __future__ import annotations

import ipaddress
import socket
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli.common import RunRootOption, fail
from gpufleet.cli.fleet import connect_or_local
from gpufleet.cli.jobs import ContextOption, NamespaceOption
from gpufleet.console import err_console
from gpufleet.dashboard import DASHBOARD_PORT, REFRESH_S
from gpufleet.errors import FieldError, MetricsPortError, UserInputError
from gpufleet.extras import require
from gpufleet.launch.worker import DEFAULT_RUN_ROOT
from gpufleet.observe.http import check_listen, url

if TYPE_CHECKING:
    from gpufleet.cluster.client import Cluster
    from gpufleet.dashboard.auth import Reviews


class Auth(StrEnum):
    none = "none"
    token = "token"


def dashboard(
    address: Annotated[
        str, typer.Option(help="Listen address; another than loopback only with --auth token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port (0: any free port).")] = DASHBOARD_PORT,
    namespace: NamespaceOption = None,
    context: ContextOption = None,
    local: Annotated[bool, typer.Option("--local", help="Only the local runs.")] = False,
    run_root: RunRootOption = DEFAULT_RUN_ROOT,
    history: Annotated[
        list[str] | None,
        typer.Option(
            help="A checkpoint directory (or a directory of them; a URI such as "
            "s3://bucket/ckpt) whose finished jobs the History page shows. Repeatable."
        ),
    ] = None,
    refresh: Annotated[
        float, typer.Option(help="Seconds between a page's updates of itself.", min=0.5)
    ] = REFRESH_S,
    prometheus: Annotated[
        str | None,
        typer.Option(
            help="A Prometheus (http:// or https://) that scrapes gpufleet's exporter and "
            "evaluates its rules: the Fleet page shows utilization beside allocation, and "
            "the unhealthy GPUs; the Serving page each service's requests and latency."
        ),
    ] = None,
    auth: Annotated[
        Auth,
        typer.Option(
            help="none: everyone who reaches it sees what the kubeconfig may read. token: each "
            "viewer signs in with a Kubernetes token and sees what its user may read "
            "(TokenReview, SubjectAccessReview; the chart's deployment)."
        ),
    ] = Auth.none,
) -> None:
    """Serve the dashboard: the jobs of every namespace the kubeconfig may read (else of
    --namespace), and the local runs under --run-root. Ctrl-C stops it."""
    require("dashboard", "starlette", "uvicorn", "jinja2", "matplotlib", what="gpufleet dashboard")
    import uvicorn

    from gpufleet.dashboard.app import LOCAL_HOSTS, create_app
    from gpufleet.dashboard.sources import ClusterSource

    try:
        family, host = check_listen(address, port)
    except MetricsPortError as exc:
        fail(UserInputError([FieldError(exc.option, str(exc))]))
    if auth is Auth.none and not ipaddress.ip_address(host).is_loopback:
        why = f"{address} serves anyone who reaches it: only with --auth token"
        fail(UserInputError([FieldError("--address", why)]))
    _check_history(history or [])
    if prometheus is not None and not prometheus.startswith(("http://", "https://")):
        fail(UserInputError([FieldError("--prometheus", f"{prometheus}: not an http(s) URL")]))
    asked = bool(namespace or context or auth is Auth.token)
    cluster = None if local else connect_or_local(namespace, context, run_root, asked=asked)
    if auth is Auth.token and cluster is None:
        fail(UserInputError([FieldError("--auth", "token needs a cluster to review the tokens")]))
    reviews = None if cluster is None or auth is Auth.none else _reviews(cluster)
    # With tokens, by any name (an Ingress's, the Service's): a page of another site gets no
    # token (the cookie is this site's, SameSite=Strict), so DNS rebinding gains nothing.
    hosts = ("*",) if reviews is not None else (*LOCAL_HOSTS, address)
    source = None if cluster is None else ClusterSource.watched(cluster, prometheus=prometheus)
    app = create_app(run_root, source, refresh, hosts, tuple(history or ()), reviews)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(UserInputError([FieldError("--port", f"cannot listen on {address}:{port}: {exc}")]))
    sock.listen(128)
    where = url(address, sock.getsockname()[1], "/")
    err_console.print(f"dashboard at {where}" + (" (local runs only)" if cluster is None else ""))
    # uvicorn stops cleanly on SIGINT and SIGTERM (it installs its own handlers)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off")).run(sockets=[sock])


def _reviews(cluster: Cluster) -> Reviews:
    """The API server's reviews, through the cluster's own client (its ServiceAccount)."""
    from gpufleet.cluster.builtin import BuiltinApi
    from gpufleet.dashboard.auth import Reviews

    client = cluster.core.api_client
    authn, authz = (
        BuiltinApi(client, "AuthenticationV1Api"),
        BuiltinApi(client, "AuthorizationV1Api"),
    )
    return Reviews(authn, authz)


def _check_history(locations: list[str]) -> None:
    """Each --history location can be read (exit 2 with why, before serving anything)."""
    from gpufleet.dashboard.history import UNREADABLE, job_dirs

    for location in locations:
        try:
            job_dirs(location)
        except UNREADABLE as exc:
            why = f"{location}: cannot be read: {type(exc).__name__}: {exc}"
            fail(UserInputError([FieldError("--history", why)]))
