"""Signing in to a dashboard that asks for a token (``--auth token``): the login page, the cookie
it sets, signing out, and the answer to a token that is refused (gpufleet.dashboard.auth)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from starlette.authentication import AuthenticationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from gpufleet.dashboard.auth import TOKEN_COOKIE, Refused, Reviews, Unreachable

MAX_FORM = 64 * 1024  # a token is a few KiB; a larger form is not a login
# How a person gets a token to paste (the chart's docs: docs/cluster.md, "In a browser").
HOW = "kubectl create token <service-account> -n <namespace> --duration=8h"

PageFn = Callable[..., Response]


def local_path(target: str, request: Request) -> str:
    """Where to go after signing in: a path on this dashboard only (never another site)."""
    parts = urlsplit(target)
    if parts.netloc not in ("", request.url.netloc) or not parts.path.startswith("/"):
        return "/"
    path = "/" + parts.path.lstrip("/")  # "//host" is another site's address
    return path + (f"?{parts.query}" if parts.query else "")


def _reviews(request: Request) -> Reviews | None:
    reviews: Reviews | None = request.app.state.dashboard.reviews
    return reviews


def login_form(request: Request, page: PageFn) -> Response:
    if _reviews(request) is None:  # nothing to sign in to
        return RedirectResponse("/", status_code=303)
    refused = request.query_params.get("refused") == "1"
    return page(request, "login.html", 401 if refused else 200, title="Sign in", how=HOW,
                refused=refused, next=local_path(request.query_params.get("next", "/"), request),
                refresh=0)  # fmt: skip


async def login(request: Request, page: PageFn) -> Response:
    """The token pasted in the form: reviewed, then kept in an HttpOnly, SameSite=Strict cookie
    (Secure over HTTPS). A form posted from another site is refused (login CSRF)."""
    reviews = _reviews(request)
    if reviews is None:
        return RedirectResponse("/", status_code=303)
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return PlainTextResponse("a sign-in from another site is refused\n", status_code=403)
    if int(request.headers.get("content-length") or 0) > MAX_FORM:
        return PlainTextResponse("the form is too large for a token\n", status_code=413)
    form = parse_qs((await request.body())[:MAX_FORM].decode(errors="replace"))
    token, target = (form.get("token") or [""])[0].strip(), (form.get("next") or ["/"])[0]
    viewer = await run_in_threadpool(reviews.viewer, token) if token else None
    if viewer is None:
        return page(request, "login.html", 401, title="Sign in", how=HOW, refused=True,
                    next=local_path(target, request), refresh=0)  # fmt: skip
    response = RedirectResponse(local_path(target, request), status_code=303)
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")  # fmt: skip
    return response


def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response


def refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """A token the API server did not accept: a browser's cookie is dropped and the login page
    says why; a client that sent the header gets 401. The API server not answering is 503."""
    if isinstance(exc, Unreachable):
        return PlainTextResponse(f"cannot check the token: {exc}\n", status_code=503)
    if isinstance(exc, Refused) and exc.source == "cookie":
        response = RedirectResponse("/login?refused=1", status_code=303)
        response.delete_cookie(TOKEN_COOKIE, path="/")
        return response
    return PlainTextResponse(f"{exc}\n", status_code=401,
                             headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
