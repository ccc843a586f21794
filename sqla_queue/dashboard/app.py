"""Building the dashboard's Starlette application: configuration, routes, headers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqla_queue.dashboard.csrf import CsrfSigner
from sqla_queue.dashboard.database import Database
from sqla_queue.spec import INT8_MAX as BIGINT_MAX

if TYPE_CHECKING:
    from sqla_queue.queue import Queue

__all__ = ["AuthCallable", "DashboardConfig", "build_app"]

HERE = Path(__file__).resolve().parent

#: ``auth(request)``: truthy (``True``, or an identity to show, such as a user name) lets
#: that request take actions; falsy refuses them. It may be ``async``.
AuthCallable = Callable[[Request], Any | Awaitable[Any]]

# Served with every response. The pages use no inline script or style and load nothing
# from elsewhere, so the policy can forbid both; framing is refused (clickjacking of the
# action buttons).
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
        b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


@dataclass(frozen=True)
class DashboardConfig:
    """How a dashboard looks and behaves (every field has a default)."""

    #: Shown in the header and the window title.
    title: str = "sqla_queue"
    #: Jobs per page of the job list.
    page_size: int = 50
    #: Seconds between reloads of the overview and workers pages (by the page's own
    #: script, which waits while a form field has the focus); ``None``: never.
    refresh: float | None = 5.0
    #: Key of the CSRF cookie's signature; give the same one to every process serving
    #: the dashboard. ``None``: a random one per process.
    secret: str | bytes | None = None
    #: Minutes of the throughput chart.
    chart_minutes: int = 60
    #: The most rows of ``jobs`` each window of the overview reads, newest first: the
    #: chart, the finished and failed counts (beyond it they are lower bounds, shown
    #: with a ``+``). Smaller than ``queue.status()``'s own cap: this page reloads often.
    scan_cap: int = 20_000

    def __post_init__(self) -> None:
        for name in ("page_size", "chart_minutes", "scan_cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
            # Each reaches SQL as an integer (a LIMIT, a count of minutes): beyond a bigint
            # every page would fail with a raw database error instead of this one.
            if value > BIGINT_MAX:
                raise ValueError(f"{name} must be at most {BIGINT_MAX}, got {value}")
        if self.page_size > 1000:
            raise ValueError(f"page_size must be at most 1000, got {self.page_size}")
        if self.refresh is not None and (
            isinstance(self.refresh, bool)
            or not isinstance(self.refresh, int | float)
            or not self.refresh >= 1
        ):
            raise ValueError(f"refresh must be None or at least 1 second, got {self.refresh!r}")
        if not isinstance(self.title, str):
            raise TypeError(f"title must be a str, got {type(self.title).__name__}")


class _SecurityHeaders:
    """ASGI middleware adding :data:`_SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in _SECURITY_HEADERS if k not in names]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


def build_app(
    queue: Queue, bind: Any, *, auth: AuthCallable | None, config: DashboardConfig
) -> Starlette:
    """The dashboard of ``queue`` on ``bind``, as a Starlette app (see ``create_dashboard``)."""
    from sqla_queue.dashboard.views import Views

    if auth is not None and not callable(auth):
        raise TypeError(f"auth must be a callable taking the request, got {auth!r}")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    views = Views(
        queue=queue,
        db=Database(bind),
        auth=auth,
        config=config,
        signer=CsrfSigner(config.secret),
        templates=Jinja2Templates(env=env),
    )
    routes = [
        Route("/", views.overview, name="overview"),
        Route("/jobs", views.jobs, name="jobs"),
        # Ids (and task names) are taken as text and read by dashboard.params: a route
        # converter would turn 5,000 digits into a 500, or an id beyond bigint into a
        # database error.
        Route("/jobs/{job_id}", views.job, name="job"),
        Route("/workers", views.workers, name="workers"),
        Route("/jobs/{job_id}/requeue", views.requeue, methods=["POST"], name="requeue"),
        Route("/jobs/{job_id}/cancel", views.cancel, methods=["POST"], name="cancel"),
        Route("/tasks/{task}/pause", views.pause, methods=["POST"], name="pause"),
        Route("/tasks/{task}/resume", views.resume, methods=["POST"], name="resume"),
        Route("/tasks/{task}/limit", views.set_limit, methods=["POST"], name="limit"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers=views.exception_handlers())
    app.add_middleware(_SecurityHeaders)
    return app
