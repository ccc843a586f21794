"""OpenTelemetry end to end: from the request that enqueued a job to the handler that ran it.

The SDK's in-memory exporter collects the spans of a "request" (which enqueues) and of the
worker's attempt: one trace, the job's ``process`` span descending from the request, and
current while the handler runs. Job log records carry the job's id, task and attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.tracing.otel import Tracing, instrument
from tests.support import observability_app as app
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration


@pytest.fixture
def tables(engine: Engine) -> None:
    with engine.begin() as connection:
        app.create_tables(connection)


@pytest.fixture
def traced(tables: None) -> Iterator[tuple[Tracing, InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = instrument(tracer_provider=provider)
    app.seen_spans.clear()
    yield tracing, exporter, provider
    tracing.uninstrument()


def finished(SessionLocal: sessionmaker[Session], expected: int) -> bool:
    job = app.queue.Job
    with SessionLocal() as session:
        done = session.scalar(select(func.count()).where(job.status.in_(["succeeded", "failed"])))
    return done == expected


def descends_from(span: ReadableSpan, ancestor: ReadableSpan, spans: list[ReadableSpan]) -> bool:
    """Whether ``ancestor`` is ``span``'s parent, or its parent's parent, and so on."""
    by_id = {s.context.span_id: s for s in spans}
    current: ReadableSpan | None = span
    while current is not None and current.parent is not None:
        if current.parent.span_id == ancestor.context.span_id:
            return True
        current = by_id.get(current.parent.span_id)
    return False


def check_trace(
    exporter: InMemorySpanExporter, request_name: str, job_id: int, task: str
) -> ReadableSpan:
    spans = list(exporter.get_finished_spans())
    (request,) = [s for s in spans if s.name == request_name]
    (process,) = [s for s in spans if s.name == f"process {task}"]
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == request.context.trace_id
    assert descends_from(process, request, spans)
    assert process.links, "the process span links the context it was enqueued in"
    assert process.links[0].context.trace_id == request.context.trace_id
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "sqla_queue"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == task
    assert attributes["messaging.message.id"] == str(job_id)
    assert attributes["sqla_queue.job.attempt"] == 1
    # The span was current while the handler ran: its own spans would be children.
    seen = app.seen_spans[job_id]
    assert (seen.trace_id, seen.span_id) == (process.context.trace_id, process.context.span_id)
    return process


def test_sync_worker_continues_the_enqueuing_trace(
    SessionLocal: sessionmaker[Session],
    traced: tuple[Tracing, InMemorySpanExporter, TracerProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracing, exporter, provider = traced
    web = provider.get_tracer("web")
    with web.start_as_current_span("POST /orders"), SessionLocal.begin() as session:
        job_id = app.traced.enqueue(session)
    with web.start_as_current_span("POST /refunds"), SessionLocal.begin() as session:
        failing = app.fail.enqueue(session)

    worker = app.queue.worker(SessionLocal, observers=[tracing], tasks=["traced", "fail"])
    with caplog.at_level(logging.DEBUG, logger="sqla_queue.worker"), worker_thread(worker):
        wait_for(lambda: finished(SessionLocal, 2))

    process = check_trace(exporter, "POST /orders", job_id, "traced")
    assert process.status.status_code is StatusCode.UNSET
    assert dict(process.attributes or {})["sqla_queue.job.outcome"] == "succeeded"

    spans = list(exporter.get_finished_spans())
    (refund,) = [s for s in spans if s.name == "POST /refunds"]
    (failed,) = [s for s in spans if s.name == "process fail"]
    assert failed.context.trace_id == refund.context.trace_id
    assert failed.status.status_code is StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "builtins.ValueError"
    assert [event.name for event in failed.events] == ["exception"]

    # Structured logs: each record about a job names it, its task and its attempt.
    from_runner = [r for r in caplog.records if r.pathname.endswith("handlers.py")]
    assert len(from_runner) >= 5  # two started, two finished, one error at least
    assert all(getattr(r, "job_id", None) is not None for r in from_runner)
    about = [r for r in caplog.records if getattr(r, "job_id", None) is not None]
    by_job = {(r.job_id, r.task, r.attempt) for r in about}  # type: ignore[attr-defined]
    assert by_job == {(job_id, "traced", 1), (failing, "fail", 1)}
    (error,) = [r for r in about if r.levelno == logging.ERROR]
    assert error.job_id == failing  # type: ignore[attr-defined]
    assert "fails on purpose" in error.getMessage()


async def test_async_worker_continues_the_enqueuing_trace(
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    traced: tuple[Tracing, InMemorySpanExporter, TracerProvider],
) -> None:
    tracing, exporter, provider = traced
    with provider.get_tracer("web").start_as_current_span("POST /async"):
        async with AsyncSessionLocal.begin() as session:
            job_id = await app.traced_async.enqueue(session)

    worker = app.queue.async_worker(AsyncSessionLocal, observers=[tracing], tasks=["traced_async"])
    run = asyncio.create_task(worker.run())
    try:
        for _ in range(600):
            if await asyncio.to_thread(finished, SessionLocal, 1):
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)

    check_trace(exporter, "POST /async", job_id, "traced_async")


def test_a_job_enqueued_outside_any_trace_starts_its_own(
    SessionLocal: sessionmaker[Session],
    traced: tuple[Tracing, InMemorySpanExporter, TracerProvider],
) -> None:
    tracing, exporter, _ = traced
    with SessionLocal.begin() as session:
        job_id = app.traced.enqueue(session)
    worker = app.queue.worker(SessionLocal, observers=[tracing], tasks=["traced"])
    with worker_thread(worker):
        wait_for(lambda: finished(SessionLocal, 1))
    spans = [s for s in exporter.get_finished_spans() if s.name == "process traced"]
    (process,) = spans
    # No create span when the enqueue path does not name the task: then a root.
    creates = [s for s in exporter.get_finished_spans() if s.name == "create traced"]
    if creates:
        assert process.parent is not None
        assert process.parent.span_id == creates[0].context.span_id
    else:
        assert process.parent is None
    assert app.seen_spans[job_id].span_id == process.context.span_id
