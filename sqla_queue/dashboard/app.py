"""Building the dashboard's Starlette application: routes, templates, headers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqla_queue.dashboard.config import AuthCallable, DashboardConfig
from sqla_queue.dashboard.csrf import CsrfSigner
from sqla_queue.dashboard.database import Database
from sqla_queue.dashboard.durable_views import DurablePages
from sqla_queue.dashboard.queue_protocol import DashboardQueue
from sqla_queue.dashboard.views import Views
from sqla_queue.dashboard.workflow_views import WorkflowPages

__all__ = ["build_app"]

HERE = Path(__file__).resolve().parent

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
    queue: DashboardQueue, bind: Any, *, auth: AuthCallable | None, config: DashboardConfig
) -> Starlette:
    """The dashboard of ``queue`` on ``bind``, as a Starlette app (see ``create_dashboard``)."""
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
    workflows = WorkflowPages(views)
    durable = DurablePages(views)
    routes = [
        Route("/", views.overview, name="overview"),
        Route("/jobs", views.jobs, name="jobs"),
        # Ids (and task names) are taken as text and read by dashboard.params: a route
        # converter would turn 5,000 digits into a 500, or an id beyond bigint into a
        # database error.
        Route("/jobs/{job_id}", views.job, name="job"),
        Route("/workers", views.workers, name="workers"),
        Route("/workflows", workflows.workflows, name="workflows"),
        Route("/workflows/{workflow_id}", workflows.workflow, name="workflow"),
        Route("/jobs/{job_id}/requeue", views.requeue, methods=["POST"], name="requeue"),
        Route("/jobs/{job_id}/cancel", views.cancel, methods=["POST"], name="cancel"),
        Route("/jobs/{job_id}/signal", durable.signal, methods=["POST"], name="signal"),
        Route("/tasks/{task}/pause", views.pause, methods=["POST"], name="pause"),
        Route("/tasks/{task}/resume", views.resume, methods=["POST"], name="resume"),
        Route("/tasks/{task}/limit", views.set_limit, methods=["POST"], name="limit"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers=views.exception_handlers())
    app.add_middleware(_SecurityHeaders)
    return app
