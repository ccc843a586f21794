"""A queue of its own for the metrics and tracing tests, with tasks that report what they see.

Its tables live in their own schema, created per test (``create_tables``), so that these
tasks never join the shared test app's registry.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import trace
from sqlalchemy import Connection, MetaData, text
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Queue, RetryPolicy

SCHEMA = "obs_jobs"

queue = Queue(metadata=MetaData(), schema=SCHEMA, lost_interval=30.0)

#: The span context current in each traced handler, by job id.
seen_spans: dict[int, trace.SpanContext] = {}


def create_tables(connection: Connection) -> None:
    """This queue's schema and tables, in a test's fresh database."""
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    queue.create_all(connection)


@queue.task(name="ok")
def ok(n: int = 0) -> int:
    """Succeed."""
    return n


@queue.task(name="fail")
def fail() -> None:
    """Fail for good (max_attempts 1)."""
    raise ValueError("fails on purpose")


@queue.task(
    name="flaky",
    pass_context=True,
    max_attempts=2,
    retry=RetryPolicy(min_delay=0.05, max_delay=0.05, jitter=0.0),
)
def flaky(ctx: JobContext[Session]) -> int:
    """Fail the first attempt, succeed the second."""
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails on purpose")
    return ctx.attempt


@queue.task(name="ok_async")
async def ok_async(n: int = 0) -> int:
    """Succeed, asynchronously."""
    await asyncio.sleep(0)
    return n


@queue.task(name="fail_async")
async def fail_async() -> None:
    """Fail for good, asynchronously."""
    await asyncio.sleep(0)
    raise ValueError("fails on purpose")


@queue.task(name="traced", pass_context=True)
def traced(ctx: JobContext[Any]) -> None:
    """Note the span current while the handler runs."""
    seen_spans[ctx.job_id] = trace.get_current_span().get_span_context()


@queue.task(name="traced_async", pass_context=True)
async def traced_async(ctx: JobContext[Any]) -> None:
    """Note the span current while the handler runs, asynchronously."""
    await asyncio.sleep(0)
    seen_spans[ctx.job_id] = trace.get_current_span().get_span_context()
