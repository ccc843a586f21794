"""How a dashboard is configured: its settings, and the host's ``auth`` callable."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from sqla_queue.checks import INT8_MAX as BIGINT_MAX
from sqla_queue.checks import is_number, is_whole_number

__all__ = ["AuthCallable", "DashboardConfig"]

#: ``auth(request)``: truthy (``True``, or an identity to show, such as a user name) lets
#: that request take actions; falsy refuses them. It may be ``async``.
AuthCallable = Callable[[Request], Any | Awaitable[Any]]


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
            if not is_whole_number(value) or int(value) < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
            # Each reaches SQL as an integer (a LIMIT, a count of minutes): beyond a bigint
            # every page would fail with a raw database error instead of this one.
            if int(value) > BIGINT_MAX:
                raise ValueError(f"{name} must be at most {BIGINT_MAX}, got {value}")
        if self.page_size > 1000:
            raise ValueError(f"page_size must be at most 1000, got {self.page_size}")
        if self.refresh is not None and not (is_number(self.refresh) and self.refresh >= 1):
            raise ValueError(f"refresh must be None or at least 1 second, got {self.refresh!r}")
        if not isinstance(self.title, str):
            raise TypeError(f"title must be a str, got {type(self.title).__name__}")
