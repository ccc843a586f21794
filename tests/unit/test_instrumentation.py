"""The instrumentation plumbing without a database: payload hooks, observers, the runner.

* payloads carry hook fields beside the arguments, and old payloads still decode;
* the handler runner tells its observers about each attempt, before the core hears the
  outcome, and a failing observer loses nothing;
* job log records carry ``job_id``, ``task`` and ``attempt``;
* the Prometheus and OpenTelemetry observers count and trace what they are told.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from sqla_queue import Retry, RetryPolicy, WorkerSettings
from sqla_queue.instrumentation import CompositeObserver, NoOpObserver, notify_lost
from sqla_queue.logic.outcomes import ClaimedJob, Outcome, OutcomeKind
from sqla_queue.logic.payload import (
    add_payload_hook,
    decode_arguments,
    make_payload,
    payload_extras,
    remove_payload_hook,
)
from sqla_queue.worker.handlers import HandlerRunner, RunningJob
from sqla_queue.worker.plan import TaskRuntime

pytestmark = pytest.mark.unit

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


class Recorder(NoOpObserver):
    """Remembers every call, and what the core had been told at the time."""

    def __init__(self, recorded: list[Outcome] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.recorded = recorded

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        self.calls.append(("started", job.id, queue_wait))

    def job_finished(
        self, job: ClaimedJob, outcome: OutcomeKind, duration: float, error: BaseException | None
    ) -> None:
        seen = len(self.recorded) if self.recorded is not None else None
        self.calls.append(("finished", job.id, outcome, duration, type(error), seen))

    def jobs_lost(self, tasks: Sequence[str]) -> None:
        self.calls.append(("lost", list(tasks)))


class Broken(NoOpObserver):
    """Raises from every method."""

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        raise RuntimeError("broken observer")

    def job_finished(
        self, job: ClaimedJob, outcome: OutcomeKind, duration: float, error: BaseException | None
    ) -> None:
        raise RuntimeError("broken observer")


@pytest.fixture
def hooks() -> Iterator[list[Any]]:
    """Hooks a test installs, removed after it."""
    installed: list[Any] = []
    yield installed
    for hook in installed:
        remove_payload_hook(hook)


# -- payloads -------------------------------------------------------------------------------


def test_payload_without_hooks_is_unchanged() -> None:
    assert make_payload([1], {"to": "a"}, task="t") == {"args": [1], "kwargs": {"to": "a"}}


def test_hook_fields_ride_beside_the_arguments(hooks: list[Any]) -> None:
    seen: list[str | None] = []

    def hook(task: str | None) -> dict[str, str]:
        seen.append(task)
        return {"traceparent": "00-abc-def-01"}

    hooks.append(hook)
    add_payload_hook(hook)
    add_payload_hook(hook)  # twice is once
    payload = make_payload([1, 2], {"to": "a"}, task="send_email")
    assert seen == ["send_email"]
    assert payload["traceparent"] == "00-abc-def-01"
    assert decode_arguments(payload) == ([1, 2], {"to": "a"})
    assert payload_extras(payload) == {"traceparent": "00-abc-def-01"}
    remove_payload_hook(hook)
    assert make_payload([], {}) == {"args": [], "kwargs": {}}


def test_old_payloads_decode_without_extras() -> None:
    old = {"args": ["x"], "kwargs": {"n": 1}}
    assert decode_arguments(old) == (["x"], {"n": 1})
    assert payload_extras(old) == {}
    assert payload_extras(None) == {}
    assert payload_extras({"args": [], "kwargs": {}, "traceparent": 5}) == {}


def test_bad_hook_fields_are_dropped_and_a_raising_hook_ignored(
    hooks: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    def bad(task: str | None) -> dict[str, Any]:
        return {"args": "nope", "kwargs": "nope", "n": 1, "nul": "a\x00b", "ok": "yes"}

    def raising(task: str | None) -> dict[str, str]:
        raise ValueError("hook bug")

    hooks.extend([bad, raising])
    add_payload_hook(bad)
    add_payload_hook(raising)
    with caplog.at_level(logging.WARNING, logger="sqla_queue.payload"):
        payload = make_payload(["a"], {"k": 1})
    assert payload == {"args": ["a"], "kwargs": {"k": 1}, "ok": "yes"}
    assert any("hook bug" in (r.exc_text or "") for r in caplog.records)


# -- the runner and its observers -----------------------------------------------------------


def _runtime(handler: Any, *, is_async: bool = False, max_attempts: int = 3) -> TaskRuntime:
    return TaskRuntime(
        name="t",
        handler=handler,
        is_async=is_async,
        pass_context=False,
        max_attempts=max_attempts,
        retry=RetryPolicy(min_delay=1, max_delay=1, jitter=0),
        lease=30.0,
        max_reclaims=2,
    )


@dataclass(frozen=True)
class DueJob(ClaimedJob):
    """A claimed job that knows its due time, as the claim will return it."""

    execute_at: dt.datetime | None = None


def _running(runtime: TaskRuntime, job: ClaimedJob | None = None) -> RunningJob:
    job = job or ClaimedJob(
        id=7, task="t", attempt=1, max_attempts=3, reclaims=0, queue_id=None, payload={}
    )
    return RunningJob(job, runtime, [], {}, None)


def _runner(observer: Any, recorded: list[Outcome]) -> HandlerRunner:
    return HandlerRunner(
        worker_id=uuid.uuid4(),
        clock=lambda: T0,
        record=lambda running, outcome: recorded.append(outcome),
        observer=observer,
    )


def test_runner_tells_observers_before_the_core() -> None:
    recorded: list[Outcome] = []
    observer = Recorder(recorded)
    _runner(observer, recorded).run_sync(_running(_runtime(lambda: "done")))
    assert [o.kind for o in recorded] == [OutcomeKind.SUCCEEDED]
    started, finished = observer.calls
    assert started[:2] == ("started", 7)
    assert started[2] is not None and started[2] >= 0
    assert finished[:3] == ("finished", 7, OutcomeKind.SUCCEEDED)
    assert finished[3] >= 0
    assert finished[4] is type(None)
    assert finished[5] == 0, "job_finished must come before the core records the outcome"


def test_runner_reports_a_retry_with_its_error() -> None:
    def handler() -> None:
        raise Retry("later")

    recorded: list[Outcome] = []
    observer = Recorder(recorded)
    _runner(observer, recorded).run_sync(_running(_runtime(handler)))
    assert observer.calls[1][2] is OutcomeKind.RETRY
    assert observer.calls[1][4] is Retry


def test_async_runner_tells_observers() -> None:
    async def handler() -> None:
        raise ValueError("boom")

    recorded: list[Outcome] = []
    observer = Recorder(recorded)
    runtime = _runtime(handler, is_async=True, max_attempts=1)
    job = ClaimedJob(
        id=7, task="t", attempt=1, max_attempts=1, reclaims=0, queue_id=None, payload={}
    )
    asyncio.run(_runner(observer, recorded).run_async(_running(runtime, job)))
    assert [c[0] for c in observer.calls] == ["started", "finished"]
    assert observer.calls[1][2] is OutcomeKind.FAILED
    assert observer.calls[1][4] is ValueError
    assert [o.kind for o in recorded] == [OutcomeKind.FAILED]


def test_queue_wait_comes_from_the_due_time_when_the_claim_returns_it() -> None:
    job = DueJob(
        id=8,
        task="t",
        attempt=1,
        max_attempts=3,
        reclaims=0,
        queue_id=None,
        payload={},
        execute_at=T0 - dt.timedelta(seconds=42),
    )
    recorded: list[Outcome] = []
    observer = Recorder(recorded)
    _runner(observer, recorded).run_sync(_running(_runtime(lambda: None), job))
    assert observer.calls[0] == ("started", 8, 42.0)


def test_a_failing_observer_loses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    recorded: list[Outcome] = []
    after = Recorder(recorded)
    with caplog.at_level(logging.WARNING, logger="sqla_queue.instrumentation"):
        runner = _runner(CompositeObserver([Broken(), after]), recorded)
        runner.run_sync(_running(_runtime(lambda: 1)))
    assert [o.kind for o in recorded] == [OutcomeKind.SUCCEEDED]
    assert [c[0] for c in after.calls] == ["started", "finished"]
    failures = [r for r in caplog.records if "broken" in (r.exc_text or "")]
    assert len(failures) == 2
    assert all(getattr(r, "job_id", None) == 7 for r in failures)


def test_composite_order_nests() -> None:
    calls: list[str] = []

    class Named(NoOpObserver):
        def __init__(self, name: str) -> None:
            self.name = name

        def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
            calls.append(f"start {self.name}")

        def job_finished(
            self,
            job: ClaimedJob,
            outcome: OutcomeKind,
            duration: float,
            error: BaseException | None,
        ) -> None:
            calls.append(f"finish {self.name}")

    job = _running(_runtime(lambda: None)).job
    both = CompositeObserver([Named("a"), Named("b")])
    both.job_started(job, None)
    both.job_finished(job, OutcomeKind.SUCCEEDED, 0.0, None)
    assert calls == ["start a", "start b", "finish b", "finish a"]


def test_notify_lost_reports_tasks_and_is_silent_without_observers() -> None:
    observer = Recorder()
    notify_lost([observer], ["a", "b"])
    notify_lost([observer], [])
    notify_lost([], ["c"])
    assert observer.calls == [("lost", ["a", "b"])]


def test_settings_check_observers() -> None:
    observer = Recorder()
    assert WorkerSettings(observers=[observer]).observers == (observer,)
    assert WorkerSettings().observers == ()
    with pytest.raises(TypeError, match="job_started"):
        WorkerSettings(observers=[object()])
    with pytest.raises(TypeError, match="list of observers"):
        WorkerSettings(observers=observer)  # type: ignore[arg-type]


def test_job_log_records_carry_job_fields(caplog: pytest.LogCaptureFixture) -> None:
    def handler() -> None:
        raise ValueError("boom")

    recorded: list[Outcome] = []
    job = ClaimedJob(
        id=11, task="t", attempt=2, max_attempts=3, reclaims=0, queue_id=None, payload={}
    )
    with caplog.at_level(logging.DEBUG, logger="sqla_queue.worker"):
        _runner(None, recorded).run_sync(_running(_runtime(handler), job))
    about_job = [r for r in caplog.records if r.name == "sqla_queue.worker"]
    assert len(about_job) >= 3  # started, the error, finished
    for record in about_job:
        assert (record.job_id, record.task, record.attempt) == (11, "t", 2), record.getMessage()  # type: ignore[attr-defined]


# -- the shipped observers ------------------------------------------------------------------


def test_prometheus_observer_counts_what_it_is_told(hooks: list[Any]) -> None:
    from prometheus_client import CollectorRegistry

    from sqla_queue.metrics.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    job = _running(_runtime(lambda: None)).job
    metrics.job_started(job, 0.5)
    metrics.job_finished(job, OutcomeKind.SUCCEEDED, 0.2, None)
    metrics.job_started(job, None)
    metrics.job_finished(job, OutcomeKind.RETRY, 0.1, ValueError())
    metrics.job_finished(job, OutcomeKind.RELEASE, 9.0, None)
    metrics.jobs_lost(["t", "t"])
    hooks.append(metrics.payload_hook)
    add_payload_hook(metrics.payload_hook)
    make_payload([], {}, task="t")
    make_payload([], {})  # a check, not an enqueue

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"task": "t", **labels})

    assert value("sqla_queue_jobs_started_total") == 2
    assert value("sqla_queue_jobs_succeeded_total") == 1
    assert value("sqla_queue_jobs_retried_total") == 1
    assert value("sqla_queue_jobs_lost_total") == 2
    assert value("sqla_queue_jobs_enqueued_total") == 1
    assert value("sqla_queue_job_duration_seconds_count") == 2
    assert value("sqla_queue_job_queue_wait_seconds_count") == 1
    assert value("sqla_queue_job_queue_wait_seconds_bucket", le="0.5") == 1


def test_otel_process_span_is_a_child_of_the_enqueue_context(hooks: list[Any]) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode

    from sqla_queue.tracing.otel import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider)
    hooks.append(tracing.payload_hook)
    add_payload_hook(tracing.payload_hook)
    with provider.get_tracer("test").start_as_current_span("request"):
        payload = make_payload(["x"], {}, task="t")
    assert payload["traceparent"].startswith("00-")
    job = ClaimedJob(
        id=5, task="t", attempt=1, max_attempts=1, reclaims=0, queue_id="k", payload=payload
    )
    tracing.job_started(job, 1.5)
    tracing.job_finished(job, OutcomeKind.FAILED, 0.1, ValueError("boom"))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request, create, process = spans["request"], spans["create t"], spans["process t"]
    assert create.parent is not None and create.parent.span_id == request.context.span_id
    assert create.kind is SpanKind.PRODUCER
    assert process.parent is not None and process.parent.span_id == create.context.span_id
    assert process.context.trace_id == request.context.trace_id
    assert process.kind is SpanKind.CONSUMER
    assert [link.context.span_id for link in process.links] == [create.context.span_id]
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "sqla_queue"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "t"
    assert attributes["messaging.message.id"] == "5"
    assert attributes["sqla_queue.job.outcome"] == "failed"
    assert attributes["error.type"] == "builtins.ValueError"
    assert process.status.status_code is StatusCode.ERROR
    assert [e.name for e in process.events] == ["exception"]


def test_the_library_imports_no_metrics_or_tracing_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, sqla_queue, sqla_queue.worker.sync, sqla_queue.worker.aio, "
        "sqla_queue.cli.main, sqla_queue.metrics, sqla_queue.tracing, sqla_queue.metrics.serve\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prometheus_client', 'opentelemetry'))\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
