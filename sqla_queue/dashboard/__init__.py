"""A web dashboard for a :class:`~sqla_queue.Queue`: an ASGI app to mount in your own.

``app.mount("/queue", queue.dashboard(engine, auth=is_admin))`` in a FastAPI or Starlette
application, or ``sqla-queue dashboard myapp.jobs:queue`` on its own. It needs the
``dashboard`` extra (``pip install 'sqla-queue[dashboard]'``: Starlette, Jinja2, uvicorn).

Pages: an overview per task (counts, limits, pauses, throughput chart), the job list with
filters and pagination, a job's detail (arguments, every attempt's error, result, links),
the recent workflows and each one's graph (drawn as SVG on the server), the live workers.
Actions (requeue, cancel, pause, resume, concurrency limits) exist only for requests the
host's ``auth`` accepts; without ``auth`` the dashboard is read-only. Every action needs
the page's CSRF token (see :mod:`sqla_queue.dashboard.csrf`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqla_queue.dashboard.app import build_app
from sqla_queue.dashboard.config import AuthCallable, DashboardConfig
from sqla_queue.dashboard.database import DashboardBind
from sqla_queue.dashboard.queue_protocol import DashboardQueue

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["AuthCallable", "DashboardBind", "DashboardConfig", "DashboardQueue", "create_dashboard"]


def create_dashboard(
    queue: DashboardQueue,
    bind: DashboardBind,
    *,
    auth: AuthCallable | None = None,
    title: str = "sqla_queue",
    config: DashboardConfig | None = None,
    **options: Any,
) -> Starlette:
    """The dashboard of ``queue`` as an ASGI app (a ``Starlette`` instance).

    ``queue``: a :class:`~sqla_queue.Queue` (any object with the members of
    :class:`DashboardQueue`).

    ``bind``: the host's ``Engine``, ``sessionmaker``, ``AsyncEngine`` or
    ``async_sessionmaker``; pages read in short transactions of their own (a sync bind in
    Starlette's thread pool). ``auth``: a callable taking the Starlette ``Request`` and
    returning (or, if ``async``, resolving to) ``True`` or an identity to let it take
    actions, a falsy value to refuse them; without it every request is read-only (no action
    form is shown, every POST gets 403). Viewing is not guarded by ``auth``: protect the
    mount point as you protect the rest of your admin pages.

    ``title`` and the other ``options`` are :class:`DashboardConfig` fields (``page_size``,
    ``refresh``, ``secret``, ``chart_minutes``, ``scan_cap``); or pass a whole ``config``.
    """
    if config is None:
        config = DashboardConfig(title=title, **options)
    elif options or title != "sqla_queue":
        raise TypeError("give either config= or the separate options, not both")
    return build_app(queue, bind, auth=auth, config=config)
