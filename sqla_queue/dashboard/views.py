"""The dashboard's pages and actions.

Pages read through :class:`~sqla_queue.dashboard.database.Database` in one short
transaction each. Actions (POST) run only for a request the host's ``auth`` accepts and
that carries a valid CSRF token; they call the same :class:`~sqla_queue.Queue` methods as
the CLI (the members of :class:`~sqla_queue.dashboard.queue_protocol.DashboardQueue`),
then redirect (303) to a page that says what happened.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from sqlalchemy.engine import Connection
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from sqla_queue._identifiers import MAX_TASK_NAME
from sqla_queue.admin import RequeueReport
from sqla_queue.checks import INT4_MAX as INTEGER_MAX
from sqla_queue.checks import INT8_MAX as BIGINT_MAX
from sqla_queue.dashboard import params
from sqla_queue.dashboard.chart import bar_chart, sparkline
from sqla_queue.dashboard.config import AuthCallable, DashboardConfig
from sqla_queue.dashboard.csrf import COOKIE_NAME, FIELD_NAME, CsrfSigner
from sqla_queue.dashboard.database import Database
from sqla_queue.dashboard.params import RequestRefused
from sqla_queue.dashboard.queries import JobFilters, read_job, read_job_page, read_throughput
from sqla_queue.dashboard.queue_protocol import DashboardQueue
from sqla_queue.errors import CancelBlockedError, SqlaQueueError, UnknownTaskError
from sqla_queue.links import MAX_ABOUT_TEXT
from sqla_queue.spec import MAX_QUEUE_ID
from sqla_queue.statements.listing import JOB_STATES
from sqla_queue.status import read_status

__all__ = ["NOTICES", "Access", "Views"]

#: What a page says after an action redirected to it (``?done=CODE``). Codes, not text,
#: travel in the URL, so a crafted link cannot make the dashboard say anything else.
NOTICES = {
    "requeued": "Job requeued: it runs again from its first attempt.",
    "not-requeued": "Nothing was requeued: only a failed or cancelled job can be.",
    "cancel-cancelled": "Job cancelled: it will not run.",
    "cancel-requested": (
        "Cancel requested: the job is running; its worker learns it within a heartbeat."
    ),
    "cancel-finished": "Nothing was cancelled: the job had already finished.",
    "cancel-blocked": "Nothing was cancelled: the job's rows stayed locked; try again.",
    "paused": "Task paused: workers stop claiming it within their maintenance interval.",
    "resumed": "Task resumed: workers claim it again within their maintenance interval.",
    "limit-set": "Concurrency limit stored: it applies at the next claim.",
    "limit-unset": "Stored concurrency limit removed: the declared one (if any) applies.",
    "signal-woke": "Signal sent: the job was waiting for it and runs again.",
    "signal-stored": "Signal sent: the job reads it when it waits for it.",
    "signal-repeated": "Nothing was sent: a signal of this name had been sent before.",
    "signal-finished": "Signal stored, but the job had already finished: it never reads it.",
}

_ERROR_TITLES = {400: "Bad request", 404: "Not found"}
_MAX_FORM_BYTES = 16_384
_FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Access:
    """What one request may do: take actions or not, and who the host says it is."""

    allowed: bool
    #: What ``auth`` returned, as text, when it was not just ``True``.
    identity: str | None = None


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _when(value: dt.datetime | str | None) -> str:
    """A time as this machine shows it, to the second; ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return value
        return parsed.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _attempt(ended: int, live: int | None) -> int:
    """The attempts a job has made, as its state badge reads: ``jobs.attempts`` counts
    those that ended, and a running job is on its execution's attempt (``live``)."""
    return max(ended, live or 0)


def _seconds(value: float | None) -> str:
    """A duration for people: ``42 s``, ``3 min``, ``2.5 h``; ``-`` for none."""
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    if value < 172_800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def _job_filters(query: Mapping[str, str]) -> JobFilters:
    """The job list's filters from its query string; :class:`RequestRefused` (400) for a
    value no job can have."""
    state = params.optional_text(query, "state", max_length=32)
    about = params.optional_text(query, "about", max_length=2 * MAX_ABOUT_TEXT + 1)
    about_table = about_key = None
    if about is not None:
        about_table, sep, rest = about.partition(":")
        if not about_table or (sep and not rest):
            raise RequestRefused(
                400, f"The linked row is TABLE or TABLE:KEY (orders:42), not {params.shown(about)}."
            )
        params.text("the linked row's table", about_table, max_length=MAX_ABOUT_TEXT)
        about_key = params.text("the linked row's key", rest, max_length=MAX_ABOUT_TEXT) or None
    return JobFilters(
        task=params.optional_text(query, "task", max_length=MAX_TASK_NAME),
        state=None if state is None else params.choice("state", state.lower(), JOB_STATES),
        # Not stripped: a key may begin or end with a space.
        key=params.optional_text(query, "key", max_length=MAX_QUEUE_ID, strip=False),
        about_table=about_table,
        about_key=about_key,
        before=params.optional_whole_number(query, "before", low=1, high=BIGINT_MAX),
    )


class Views:
    """Every endpoint of one dashboard, sharing its queue, database and settings."""

    def __init__(
        self,
        *,
        queue: DashboardQueue,
        db: Database,
        auth: AuthCallable | None,
        config: DashboardConfig,
        signer: CsrfSigner,
        templates: Jinja2Templates,
    ) -> None:
        self.queue = queue
        self.db = db
        self.auth = auth
        self.config = config
        self.signer = signer
        self.templates = templates

    # -- plumbing ------------------------------------------------------------------------

    async def access(self, request: Request) -> Access:
        """Ask the host's ``auth`` about ``request``; without one, nobody takes actions."""
        if self.auth is None:
            return Access(False)
        verdict = self.auth(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is None or verdict is False or verdict == "":
            return Access(False)
        return Access(True, None if verdict is True else str(verdict))

    @staticmethod
    def _path(
        request: Request, name: str, query: Mapping[str, Any] | None = None, **params: Any
    ) -> str:
        path = request.url_for(name, **params).path
        wanted = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return f"{path}?{urlencode(wanted)}" if wanted else path

    def render(
        self,
        request: Request,
        template: str,
        context: dict[str, Any],
        access: Access,
        *,
        status: int = 200,
        refresh: bool = False,
    ) -> Response:
        """Render a page; when it shows action forms, give it a CSRF token (and cookie)."""
        token: str | None = None
        new_cookie: str | None = None
        if access.allowed:
            token = self.signer.token_of(request.cookies.get(COOKIE_NAME))
            if token is None:
                token, new_cookie = self.signer.new_cookie()
        done = request.query_params.get("done")

        def link(name: str, query: Mapping[str, Any] | None = None, **params: Any) -> str:
            return self._path(request, name, query, **params)

        page = {
            "title": self.config.title,
            "access": access,
            "csrf_field": FIELD_NAME,
            "csrf_token": token,
            "notice": NOTICES.get(done) if done else None,
            "error": None,
            "refresh": self.config.refresh if refresh else None,
            "link": link,
            "when": _when,
            "seconds": _seconds,
            "attempt": _attempt,
            "nav": "",
            **context,
        }
        response = self.templates.TemplateResponse(request, template, page, status_code=status)
        response.headers["cache-control"] = "no-store"
        if new_cookie is not None:
            response.set_cookie(
                COOKIE_NAME,
                new_cookie,
                path=request.scope.get("root_path") or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    def exception_handlers(self) -> dict[Any, Any]:
        """Starlette exception handlers rendering errors as dashboard pages: Starlette's
        own (an unknown path, a wrong method) and a :class:`RequestRefused` of a view."""

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            return await self._error_page(request, exc.status_code, exc.detail)

        async def refused(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, RequestRefused)
            return await self._error_page(request, exc.status, exc.reason)

        return {HTTPException: http_error, RequestRefused: refused}

    async def _error_page(self, request: Request, status: int, reason: str) -> Response:
        title = _ERROR_TITLES.get(status, "Refused")
        context = {"page_title": title, "error": reason}
        return self.render(
            request, "error.html", context, await self.access(request), status=status
        )

    @staticmethod
    def _same_origin(request: Request, origin: str) -> bool:
        try:
            parts = urlsplit(origin)
        except ValueError:  # "http://[x": not an origin at all
            return False
        return (parts.scheme, parts.netloc) == (request.url.scheme, request.url.netloc)

    async def _guard(self, request: Request) -> dict[str, str]:
        """The action's form, once ``auth``, the origin and the CSRF token all agree."""
        access = await self.access(request)
        if not access.allowed:
            raise RequestRefused(403, "This dashboard is read-only: actions need the host's auth.")
        origin = request.headers.get("origin")
        if origin is not None and origin != "null" and not self._same_origin(request, origin):
            raise RequestRefused(403, "Refused: the form was sent from another site.")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:
                raise RequestRefused(413, "The form is too large.")
        # An empty body is an empty form (and fails the token check below).
        if body and not request.headers.get("content-type", "").startswith(_FORM_TYPE):
            raise RequestRefused(415, f"Actions take a form ({_FORM_TYPE}).")
        try:
            parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
        except (UnicodeDecodeError, ValueError):
            raise RequestRefused(400, "The form could not be read.") from None
        form = {key: values[-1] for key, values in parsed.items()}
        if not self.signer.check(request.cookies.get(COOKIE_NAME), form.get(FIELD_NAME)):
            raise RequestRefused(
                403, "Refused: the form's CSRF token is missing or invalid. Reload the page."
            )
        return form

    # -- pages ---------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        """Per task: counts, limit, pause, throughput; the last hour's chart; workers."""
        access = await self.access(request)
        queue, config = self.queue, self.config

        def read(connection: Connection) -> tuple[Any, Any, Any]:
            # read_status rather than queue.status: the same reading, with this page's
            # smaller row cap (measured: the default cap's walks dominate the page).
            limits = queue.limits(connection)
            declared = {n: lim.declared for n, lim in limits.items() if lim.declared is not None}
            status = read_status(
                connection,
                queue.tables,
                tasks=sorted(queue.tasks),
                declared_limits=declared,
                scan_cap=config.scan_cap,
            )
            chart = read_throughput(
                connection,
                queue.tables,
                status.now,
                minutes=config.chart_minutes,
                cap=config.scan_cap,
            )
            return status, limits, chart

        status, limits, chart = await self.db.read(read)
        total = chart.total
        context = {
            "page_title": "Overview",
            "nav": "overview",
            "status": status,
            "limits": limits,
            "chart": chart,
            "total_chart": bar_chart(
                total, chart.start, label=f"jobs finished per minute, last {chart.minutes} min"
            ),
            "sparks": {
                task: sparkline(counts, label=f"{task}: finished per minute")
                for task, counts in chart.per_task.items()
            },
            "peak": max(total, default=0),
            "scan_cap": config.scan_cap,
        }
        return self.render(request, "overview.html", context, access, refresh=True)

    async def jobs(self, request: Request) -> Response:
        """The job list: filters, newest first, a page at a time (keyset on the id)."""
        access = await self.access(request)
        query = request.query_params
        context: dict[str, Any] = {
            "page_title": "Jobs",
            "nav": "jobs",
            # As typed, so a refused filter can be corrected in place.
            "filters": {name: query.get(name, "") for name in ("task", "state", "key", "about")},
            "states": JOB_STATES,
            "tasks": sorted(self.queue.tasks),
            "page": None,
        }
        try:
            filters = _job_filters(query)
        except RequestRefused as refused:
            context["error"] = refused.reason
            return self.render(request, "jobs.html", context, access, status=refused.status)
        shown = {
            "task": filters.task,
            "state": filters.state,
            "key": filters.key,
            "about": query.get("about", "").strip(),
        }
        context["filters"] = {name: value or "" for name, value in shown.items()}
        queue, size = self.queue, self.config.page_size
        page = await self.db.read(
            lambda connection: read_job_page(connection, queue.tables, filters, page_size=size)
        )
        context["page"] = page
        if page.next_before is not None:
            context["older"] = self._path(request, "jobs", {**shown, "before": page.next_before})
        context["newest"] = self._path(request, "jobs", shown)
        context["first_page"] = filters.before is None
        return self.render(request, "jobs.html", context, access)

    async def job(self, request: Request) -> Response:
        """One job: arguments, every attempt's error, result, links, live execution."""
        access = await self.access(request)
        job_id = params.job_id(request.path_params["job_id"])
        job = await self.db.read(lambda connection: self.read_job(connection, job_id))
        if job is None:
            raise RequestRefused(404, f"There is no job {job_id}.")
        return self._job_page(request, job, access)

    def read_job(self, connection: Connection, job_id: int) -> dict[str, Any] | None:
        """:func:`read_job`, plus ``steps``: the job's committed steps (durable jobs)."""
        job = read_job(connection, self.queue.tables, job_id)
        if job is None:
            return None
        return {**job, "steps": list(self.queue.job_steps(connection, job_id))}

    def _job_page(
        self,
        request: Request,
        job: dict[str, Any],
        access: Access,
        *,
        refused: str | None = None,
        held_by: int | None = None,
    ) -> Response:
        """The page of ``job`` (a :func:`read_job` row); with ``refused``, the reason an
        action on it was not done (409), and the job holding its key (``held_by``)."""
        payload = job["payload"] if isinstance(job["payload"], dict) else {}
        context = {
            "page_title": f"Job {job['id']}",
            "nav": "jobs",
            "job": job,
            "args": _pretty(payload.get("args", [])),
            "kwargs": _pretty(payload.get("kwargs", {})),
            "result": None if job["result"] is None else _pretty(job["result"]),
            "errors": list(reversed(job["errors"] or [])),
            "steps": [(step, _pretty(step.result)) for step in job["steps"]],
            "can_requeue": job["status"] in ("failed", "cancelled"),
            "can_cancel": job["status"] == "queued",
            # A durable job: suspended, or with steps (it may reach a wait later).
            "can_signal": job["status"] == "queued"
            and (job["state"] == "suspended" or bool(job["steps"])),
            "error": refused,
            "held_by": held_by,
        }
        status = 200 if refused is None else 409
        return self.render(request, "job.html", context, access, status=status)

    async def workers(self, request: Request) -> Response:
        """The live workers, as their last beats left them."""
        access = await self.access(request)
        queue = self.queue
        status = await self.db.read(queue.status)
        context = {"page_title": "Workers", "nav": "workers", "status": status}
        return self.render(request, "workers.html", context, access, refresh=True)

    # -- actions -------------------------------------------------------------------------

    async def requeue(self, request: Request) -> Response:
        """Put a failed or cancelled job back in the queue. One whose unique key another
        job holds stays as it is: its page says so (409), naming that job."""
        await self._guard(request)
        job_id = params.job_id(request.path_params["job_id"])
        queue = self.queue

        def run(connection: Connection) -> tuple[dict[str, Any] | None, RequeueReport | None]:
            job = self.read_job(connection, job_id)
            return job, None if job is None else queue.requeue(connection, [job_id])

        job, report = await self.db.write(run)
        if job is None or report is None:
            raise RequestRefused(404, f"Nothing was requeued: there is no job {job_id}.")
        reason = report.refused.get(job_id)
        if reason is not None:
            return self._job_page(
                request,
                job,
                await self.access(request),
                refused=f"Job {job_id} was not requeued: {reason}.",
                held_by=report.held_by.get(job_id),
            )
        code = "requeued" if report else "not-requeued"
        return RedirectResponse(self._path(request, "job", {"done": code}, job_id=job_id), 303)

    async def cancel(self, request: Request) -> Response:
        """Cancel a queued job, or ask a running one to stop."""
        await self._guard(request)
        job_id = params.job_id(request.path_params["job_id"])
        try:
            outcomes = await self.db.cancel(self.queue, [job_id])
        except CancelBlockedError:
            outcomes = {job_id: "blocked"}
        outcome = outcomes.get(job_id, "not_found")
        if outcome == "not_found":
            raise RequestRefused(404, f"Nothing was cancelled: there is no job {job_id}.")
        return RedirectResponse(
            self._path(request, "job", {"done": f"cancel-{outcome}"}, job_id=job_id), 303
        )

    async def _task_action(self, request: Request, action: str) -> Response:
        form = await self._guard(request)
        # Whether the queue has the task is the queue's to say (UnknownTaskError, a 404
        # below): a task that is gone may still be resumed, or its limit removed.
        task = params.text("task", request.path_params["task"], max_length=MAX_TASK_NAME)
        queue = self.queue
        limit: int | None = None
        if action == "limit":
            limit = params.optional_whole_number(form, "limit", low=1, high=INTEGER_MAX)

        def run(connection: Connection) -> None:
            if action == "pause":
                queue.pause(connection, task)
            elif action == "resume":
                queue.resume(connection, task)
            else:
                queue.set_limit(connection, task, limit)

        try:
            await self.db.write(run)
        except UnknownTaskError:
            # The queue's message lists every task it knows: too long for a banner.
            raise RequestRefused(404, f"This queue has no task {params.shown(task)}.") from None
        except (SqlaQueueError, ValueError, TypeError) as exc:
            raise RequestRefused(400, str(exc)) from None
        code = {"pause": "paused", "resume": "resumed"}.get(action)
        if code is None:
            code = "limit-set" if limit is not None else "limit-unset"
        return RedirectResponse(self._path(request, "overview", {"done": code}), 303)

    async def pause(self, request: Request) -> Response:
        """Pause a task for every worker."""
        return await self._task_action(request, "pause")

    async def resume(self, request: Request) -> Response:
        """Resume a paused task."""
        return await self._task_action(request, "resume")

    async def set_limit(self, request: Request) -> Response:
        """Store a task's concurrency limit (the ``limit`` field), or remove it (empty)."""
        return await self._task_action(request, "limit")
