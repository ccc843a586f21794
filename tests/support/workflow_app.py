"""Workflow tasks on the test app's queue (tests/support/app.py).

Worker subprocesses import ``tests.support.workflow_app:queue``: the same queue, with
these tasks registered on it too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue import JobContext
from sqla_queue.workflows import ParentError
from tests.support.app import QUICK_RETRY, gate, queue

__all__ = ["queue"]


@queue.task(name="wf_value")
def wf_value(value: Any = None) -> Any:
    """Return ``value``: the node's result."""
    return value


@queue.task(name="wf_fail")
def wf_fail(message: str = "node failed") -> None:
    """Fail for good (one attempt)."""
    raise RuntimeError(message)


@queue.task(name="wf_flaky", pass_context=True, max_attempts=3, retry=QUICK_RETRY)
def wf_flaky(ctx: JobContext[Session], failures: int, value: Any = None) -> Any:
    """Fail the first ``failures`` attempts, then return ``value``."""
    if ctx.attempt <= failures:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return value


def _shown(results: dict[str, Any]) -> dict[str, Any]:
    return {
        name: {"parent": value.status} if isinstance(value, ParentError) else value
        for name, value in results.items()
    }


@queue.task(name="wf_gather", pass_context=True)
def wf_gather(ctx: JobContext[Session]) -> dict[str, Any]:
    """Return the parents' results, a failed parent as ``{"parent": status}``."""
    return _shown(ctx.parent_results)


@queue.task(name="wf_gather_async", pass_context=True)
async def wf_gather_async(ctx: JobContext[AsyncSession]) -> dict[str, Any]:
    """:func:`wf_gather` for async handlers."""
    return _shown(await ctx.fetch_parent_results())


@queue.task(name="wf_sum", pass_context=True)
def wf_sum(ctx: JobContext[Session]) -> int:
    """The sum of the parents' (integer) results."""
    return sum(v for v in ctx.parent_results.values() if isinstance(v, int))


@queue.task(name="wf_split", pass_context=True)
def wf_split(ctx: JobContext[Session], parts: int, then: bool = True) -> str:
    """Expand into ``parts`` nodes of ``wf_value`` (each returns its index), then
    ``wf_sum`` after them (or nothing after them with ``then=False``)."""
    calls = [wf_value.call(i) for i in range(parts)]
    ctx.expand(calls, then=wf_sum.call() if then else None)
    return "split"


@queue.task(name="wf_gated", pass_context=True)
def wf_gated(ctx: JobContext[Session], name: str, value: Any = None) -> Any:
    """Wait at gate ``name`` until the test opens it, then return ``value``."""
    meeting = gate(name)
    meeting.entered.set()
    meeting.opened.wait(15.0)
    return value


@queue.task(name="wf_tx", pass_context=True, transactional=True)
def wf_tx(ctx: JobContext[Session], value: Any = None, parts: int = 0) -> Any:
    """A transactional node: expands into ``parts`` values when asked, returns ``value``."""
    if parts:
        ctx.expand([wf_value.call(i) for i in range(parts)], then=wf_sum.call())
    return value


@queue.task(name="wf_split_gated", pass_context=True)
def wf_split_gated(ctx: JobContext[Session], name: str, parts: int) -> str:
    """Ask for an expansion, then wait at gate ``name``: a test fences the job off there."""
    ctx.expand([wf_value.call(i) for i in range(parts)], then=wf_sum.call())
    meeting = gate(name)
    meeting.entered.set()
    meeting.opened.wait(15.0)
    return "split"
