"""Tasks for the tests of workflows combined with the queue's other features.

Most are on the test app's queue (tests/support/app.py); importing this module also
registers a gathering task on the queue without history (tests/support/nohistory_app.py)
and on the one with partitioned history (tests/support/history_app.py), so the same
workflow can run on each layout.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Reschedule
from sqla_queue.workflows import ParentError
from tests.support import history_app, nohistory_app
from tests.support.app import ExecutionLog, log_interval, queue

__all__ = ["URGENT_PRIORITY", "queue", "shown_parents"]

#: The priority :func:`wfc_urgent` declares for its jobs.
URGENT_PRIORITY = 7


def shown_parents(results: dict[str, Any]) -> dict[str, Any]:
    """The parents' results as JSON: a parent that did not succeed as ``{"parent": status}``."""
    return {
        name: {"parent": value.status} if isinstance(value, ParentError) else value
        for name, value in results.items()
    }


def _parents(ctx: JobContext[Session]) -> dict[str, Any]:
    return shown_parents(ctx.parent_results) if ctx.in_workflow else {}


@queue.task(name="wfc_log", pass_context=True)
def wfc_log(ctx: JobContext[Session], label: str, pause: float = 0.0) -> dict[str, Any]:
    """Log the execution under ``label`` (start and end, in ``execution_log``), after a
    ``pause``; return the label and what the parents gave."""
    parents = _parents(ctx)
    started = time.time()
    if pause:
        time.sleep(pause)
    log_interval(ctx.session, ctx, started, key=label)
    return {"label": label, "parents": parents}


@queue.task(name="wfc_limited", pass_context=True)
def wfc_limited(ctx: JobContext[Session], label: str, pause: float = 0.0) -> str:
    """:func:`wfc_log` for a task the tests limit (concurrency or rate) on their own."""
    started = time.time()
    if pause:
        time.sleep(pause)
    log_interval(ctx.session, ctx, started, key=label)
    return label


@queue.task(name="wfc_reschedule", pass_context=True)
def wfc_reschedule(ctx: JobContext[Session], times: int, value: Any = None) -> Any:
    """Reschedule itself 0.1 s away ``times`` times (a reschedule uses no attempt, so the
    executions are counted in ``execution_log``), then return ``value``."""
    started = time.time()
    log_interval(ctx.session, ctx, started, key="reschedule")
    runs = ctx.session.scalar(
        select(func.count()).select_from(ExecutionLog).where(ExecutionLog.job_id == ctx.job_id)
    )
    ctx.session.commit()
    if int(runs or 0) <= times:
        return Reschedule(in_=0.1)
    return value


@queue.task(name="wfc_urgent", priority=URGENT_PRIORITY)
def wfc_urgent(value: Any = None) -> Any:
    """A task whose jobs have a declared priority."""
    return value


@queue.task(name="wfc_fragile", max_reclaims=1)
def wfc_fragile(value: Any = None) -> Any:
    """Return ``value``; a job of it lost twice fails instead of running again."""
    return value


@nohistory_app.queue.task(name="wfc_gather_nq", pass_context=True)
def wfc_gather_nq(ctx: JobContext[Session]) -> dict[str, Any]:
    """The parents' results, on the queue without history."""
    return shown_parents(ctx.parent_results)


@history_app.queue.task(name="wfc_gather_hq", pass_context=True)
def wfc_gather_hq(ctx: JobContext[Session]) -> dict[str, Any]:
    """The parents' results, on the queue with partitioned history."""
    return shown_parents(ctx.parent_results)


@nohistory_app.queue.task(name="wfc_maybe_nq")
def wfc_maybe_nq(fail: bool = False) -> str:
    """Fail when told to, else succeed, on the queue without history."""
    if fail:
        raise RuntimeError("told to fail")
    return "ok"


@history_app.queue.task(name="wfc_maybe_hq")
def wfc_maybe_hq(fail: bool = False) -> str:
    """Fail when told to, else succeed, on the queue with partitioned history."""
    if fail:
        raise RuntimeError("told to fail")
    return "ok"
