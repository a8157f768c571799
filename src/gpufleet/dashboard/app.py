"""``gpufleet dashboard``: a read-only web application over the fleet and the local runs.

Starlette serves it (ASGI, run by uvicorn), Jinja2 renders the pages on the server, matplotlib
draws the curves as inline SVG, and one small script refreshes a page's main part in place
(static/dashboard.js): no front-end framework, nothing fetched from a CDN (docs/architecture.md,
"The dashboard"). Every page is a GET; nothing in the application writes to the cluster. The
handlers are plain functions: Starlette runs them in its thread pool, so a slow read of the
cluster holds one page, not the server.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.authentication import requires
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from gpufleet.cluster.jobrows import age
from gpufleet.cluster.progress import duration
from gpufleet.dashboard import REFRESH_S, signin
from gpufleet.dashboard.auth import (
    CLUSTER_QUEUES,
    NODES,
    SCOPE,
    Reviews,
    TokenBackend,
    Viewer,
    logs_in,
)
from gpufleet.dashboard.clusterjob import job_page
from gpufleet.dashboard.history import UNREADABLE, entries, history_page, job_dirs
from gpufleet.dashboard.local import run_page
from gpufleet.dashboard.plots import svg
from gpufleet.dashboard.sources import ClusterSource
from gpufleet.dashboard.utilization import by_product
from gpufleet.errors import GpufleetError
from gpufleet.launch.runs import local_runs

# Scripts and styles from this server only; matplotlib's SVG carries a <style> element.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")  # fmt: skip
# The names a browser may reach the dashboard by: a page of another site that resolves its own
# name to 127.0.0.1 (DNS rebinding) is refused (TrustedHostMiddleware).
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass
class Dashboard:
    """What every handler reads (``request.app.state.dashboard``)."""

    templates: Jinja2Templates
    run_root: Path
    cluster: ClusterSource | None
    history: list[str]  # checkpoint locations (--history)
    reviews: Reviews | None = None  # --auth token: the API server's reviews of each viewer


def _of(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


def _viewer(request: Request) -> Viewer:
    viewer: Viewer = request.user
    return viewer


def _hidden(request: Request, what: str) -> Response | None:
    """The page of the local runs or the history (they name no namespace) for a viewer who may
    read every namespace; for another, a 404 that says so."""
    if _viewer(request).everywhere:
        return None
    return page(request, "missing.html", 404, title="Not shown",
                what=f"{what}: shown to those who may list pods in every namespace")  # fmt: skip


def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    """Template ``name`` whole, or only its main part when the refresh asks (``?part=main``)."""
    context["part"] = request.query_params.get("part") == "main"
    response = _of(request).templates.TemplateResponse(request, name, context,
                                                       status_code=status)  # fmt: skip
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    return response


@requires(SCOPE, redirect="login_form")
def home(request: Request) -> Response:
    return RedirectResponse("/jobs" if _of(request).cluster else "/runs", status_code=303)


@requires(SCOPE, redirect="login_form")
def runs(request: Request) -> Response:
    root = _of(request).run_root
    if (hidden := _hidden(request, "the local runs")) is not None:
        return hidden
    return page(request, "runs.html", title="Local runs", runs=local_runs(root), now=time.time(),
                run_root=str(root))  # fmt: skip


@requires(SCOPE, redirect="login_form")
def run(request: Request) -> Response:
    name, root = request.path_params["name"], _of(request).run_root
    if (hidden := _hidden(request, "the local runs")) is not None:
        return hidden
    found = run_page(root, name)
    if found is None:
        return page(request, "missing.html", 404, title="No such run",
                    what=f"no local run {name!r} under {root}")  # fmt: skip
    curves = found.curves
    return page(request, "run.html", title=f"Run {name}", page=found, now=time.time(),
                loss=svg(curves, "loss"), rate=svg(curves, "throughput"))  # fmt: skip


@requires(SCOPE, redirect="login_form")
def jobs(request: Request) -> Response:
    viewer = _viewer(request)
    rows = [
        r for r in _cluster(request).rows(dt.datetime.now(dt.UTC)) if viewer.may_read(r.namespace)
    ]
    query, phase = request.query_params.get("q", ""), request.query_params.get("phase", "")
    shown = [r for r in rows if query.lower() in f"{r.namespace}/{r.name}".lower()
             and (not phase or r.phase == phase)]  # fmt: skip
    return page(request, "jobs.html", title="Jobs", rows=shown, total=len(rows), q=query,
                phase=phase, phases=sorted({r.phase for r in rows} | {phase} - {""}))  # fmt: skip


@requires(SCOPE, redirect="login_form")
def job(request: Request) -> Response:
    ns, name = request.path_params["namespace"], request.path_params["name"]
    viewer = _viewer(request)
    found, logs = None, viewer.may(logs_in(ns))  # another tenant's job is "no such job"
    if viewer.may_read(ns):
        found = job_page(_cluster(request).in_namespace(ns), name, logs=logs,
                         readable=tuple(_of(request).history))  # fmt: skip
    if found is None:
        return page(request, "missing.html", 404, title="No such job",
                    what=f"no gpufleet job {name!r} in namespace {ns}")  # fmt: skip
    curves = found.curves
    return page(request, "job.html", title=f"Job {ns}/{name}", job=found, logs_shown=logs,
                loss=svg(curves, "loss"), rate=svg(curves, "throughput"))  # fmt: skip


@requires(SCOPE, redirect="login_form")
def queues(request: Request) -> Response:
    found, viewer = _cluster(request).queues(dt.datetime.now(dt.UTC)), _viewer(request)
    found = replace(
        found,
        local_queues=[q for q in found.local_queues if viewer.may_read(str(q.namespace))],
        waiting=[w for w in found.waiting if viewer.may_read(w.namespace)],
    )
    if not viewer.may(CLUSTER_QUEUES):
        found = replace(found, cluster_queues=[], readable=False)
    return page(request, "queues.html", title="Queues", queues=found)


@requires(SCOPE, redirect="login_form")
def fleet(request: Request) -> Response:
    found, viewer = _cluster(request).gpus(), _viewer(request)
    used = _cluster(request).utilization()
    if used is not None:
        nodes = viewer.may(NODES)
        used = replace(
            used,
            namespaces={ns: u for ns, u in used.namespaces.items() if viewer.may_read(ns)},
            nodes=used.nodes if nodes else {},
            unhealthy=used.unhealthy if nodes else [],
        )
    found = replace(
        found, tenants={ns: held for ns, held in found.tenants.items() if viewer.may_read(ns)}
    )
    if not viewer.may(NODES):
        found = replace(found, nodes=[], products=[])
    return page(
        request,
        "fleet.html",
        title="Fleet",
        fleet=found,
        nodes_shown=viewer.may(NODES),
        used=used,
        busy=by_product(found.nodes, used) if used else {},
    )


@requires(SCOPE, redirect="login_form")
def serving(request: Request) -> Response:
    viewer, source = _viewer(request), _cluster(request)
    seen = source.traffic()
    shown = [s for s in source.services(seen) if viewer.may_read(s.namespace)]
    return page(request, "serving.html", title="Serving", services=shown, measured=seen)


@requires(SCOPE, redirect="login_form")
def history(request: Request) -> Response:
    if (hidden := _hidden(request, "the history")) is not None:
        return hidden
    found, problems = entries(_of(request).history)
    return page(request, "history.html", title="History", entries=found, problems=problems,
                locations=_of(request).history)  # fmt: skip


@requires(SCOPE, redirect="login_form")
def past_job(request: Request) -> Response:
    """A job directory named by ``?at=``: only one the history's locations hold (never a path
    the request makes up). Not refreshed: it verifies every checkpoint it shows."""
    at = request.query_params.get("at", "")
    if (hidden := _hidden(request, "the history")) is not None:
        return hidden
    try:
        known = at in {d for location in _of(request).history for d in job_dirs(location)}
        shown = history_page(at) if known else None
    except UNREADABLE as exc:
        return page(request, "missing.html", 502, title="Unreadable",
                    what=f"{at}: {type(exc).__name__}: {exc}")  # fmt: skip
    if shown is None:
        return page(request, "missing.html", 404, title="No such job",
                    what=f"no job at {at!r} in the history's locations")  # fmt: skip
    curves = shown.curves
    return page(request, "past.html", title=f"History: {shown.entry.job}", past=shown,
                loss=svg(curves, "loss"), rate=svg(curves, "throughput"), refresh=0)  # fmt: skip


def login_form(request: Request) -> Response:
    return signin.login_form(request, page)


async def login(request: Request) -> Response:
    return await signin.login(request, page)


def healthz(request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


def _cluster(request: Request) -> ClusterSource:
    cluster = _of(request).cluster
    assert cluster is not None  # its routes exist only with a cluster
    return cluster


def failed(request: Request, exc: Exception) -> Response:
    """A cluster's refusal (forbidden, unreachable) as one line on the page, not a traceback."""
    code = 403 if "forbidden" in str(exc) else 502
    return page(request, "missing.html", code, title="The cluster said no", what=str(exc))


def create_app(
    run_root: Path,
    cluster: ClusterSource | None = None,
    refresh_s: float = REFRESH_S,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
    history_at: tuple[str, ...] = (),
    reviews: Reviews | None = None,
) -> Starlette:
    """The application over ``run_root``'s local runs, the finished jobs kept at
    ``history_at`` and, when given, a cluster; its pages update every ``refresh_s`` seconds;
    requests naming another host than ``hosts`` get 400. With ``reviews``, each viewer signs
    in with a token and sees what that token's user may read (gpufleet.dashboard.auth)."""
    package = resources.files("gpufleet.dashboard")
    templates = Jinja2Templates(directory=str(package / "templates"))
    templates.env.globals.update(age=age, duration=duration, refresh=refresh_s,
                                 cluster=cluster is not None)  # fmt: skip
    static = StaticFiles(directory=str(package / "static"))
    routes = [Route("/", home), Route("/runs", runs), Route("/runs/{name}", run),
              Route("/history", history), Route("/history/job", past_job),
              Route("/healthz", healthz), Mount("/static", static, name="static"),
              Route("/login", login_form), Route("/login", login, methods=["POST"]),
              Route("/logout", signin.logout)]  # fmt: skip
    if cluster is not None:
        routes += [Route("/jobs", jobs), Route("/jobs/{namespace}/{name}", job),
                   Route("/queues", queues), Route("/fleet", fleet),
                   Route("/serving", serving)]  # fmt: skip
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)),
                  Middleware(AuthenticationMiddleware, backend=TokenBackend(reviews),
                             on_error=signin.refused)]  # fmt: skip
    app = Starlette(routes=routes, exception_handlers={GpufleetError: failed},
                    middleware=middleware)  # fmt: skip
    app.state.dashboard = Dashboard(templates, run_root, cluster, list(history_at), reviews)
    return app
