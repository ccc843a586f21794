"""OpenTelemetry tracing: a span per job attempt, continuing the trace that enqueued the job.

Needs the ``otel`` extra (``opentelemetry-api``); the application configures the SDK and
its exporters as it does for everything else. :func:`instrument` does both halves:

- **enqueue**: each payload made in this process carries the current trace context
  (``traceparent``, and ``tracestate``/``baggage`` when set, from the configured
  propagator, W3C by default) beside the job's arguments. When the enqueue path names
  the task, a ``create <task>`` span (kind ``PRODUCER``) is made for the job, and its
  context is the one carried;
- **worker**: pass the returned :class:`Tracing` in ``observers=[...]``. Each attempt
  runs inside a ``process <task>`` span (kind ``CONSUMER``), a child of the carried
  context and linked to it, so that one trace goes from the request that enqueued the
  job to the handler that ran it (however much later, on whatever host). The span is
  current while the handler runs: spans the handler makes (an HTTP call, a database
  query) are its children.

Span attributes follow OpenTelemetry's semantic conventions for messaging
(``messaging.system`` is ``"sqla_queue"``, ``messaging.operation.type`` is ``create`` or
``process``, ``messaging.destination.name`` is the task, ``messaging.message.id`` the job
id), plus ``sqla_queue.job.*`` for the attempt, the outcome and the queue wait. A failed
attempt records its exception and sets the span's status to ``ERROR``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider

from sqla_queue.logic.outcomes import ClaimedJob, OutcomeKind
from sqla_queue.logic.payload import add_payload_hook, payload_extras, remove_payload_hook

__all__ = [
    "ATTEMPT",
    "MESSAGING_SYSTEM",
    "OUTCOME",
    "QUEUE_WAIT",
    "Tracing",
    "instrument",
]

#: The value of ``messaging.system`` on every span.
MESSAGING_SYSTEM = "sqla_queue"
#: Attributes of the library's own, beside the messaging conventions'.
ATTEMPT = "sqla_queue.job.attempt"
MAX_ATTEMPTS = "sqla_queue.job.max_attempts"
QUEUE_ID = "sqla_queue.job.queue_id"
QUEUE_WAIT = "sqla_queue.job.queue_wait"
OUTCOME = "sqla_queue.job.outcome"

#: Outcomes that are the attempt's failure: the span's status is ERROR.
_FAILURES = (OutcomeKind.FAILED, OutcomeKind.RETRY)


class _Attempt:
    """The span of the attempt running in this context, and how to restore the context."""

    __slots__ = ("job_id", "restore", "span", "token")

    def __init__(
        self, job_id: int, span: Span, token: contextvars.Token[otel_context.Context]
    ) -> None:
        self.job_id = job_id
        self.span = span
        self.token = token
        self.restore: contextvars.Token[_Attempt | None] | None = None


class Tracing:
    """The OpenTelemetry integration: a worker observer, and the enqueue-side payload hook.

    Make it with :func:`instrument`. ``tracer_provider`` defaults to the global one, and
    ``propagator`` to the global text-map propagator (W3C trace context and baggage unless
    the application configured another).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self.tracer = trace.get_tracer("sqla_queue", tracer_provider=tracer_provider)
        self._propagator = propagator
        # Per instance: two Tracing observers of one worker keep apart.
        self._current: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
            f"sqla_queue_otel_attempt_{id(self)}", default=None
        )

    # -- enqueue ------------------------------------------------------------------------------

    def payload_hook(self, task: str | None) -> dict[str, str] | None:
        """The trace fields to store in a new job's payload (see
        :func:`~sqla_queue.logic.payload.add_payload_hook`).

        With a task name, a ``create`` span is made for the job (ended at once: enqueue
        is the caller's transaction, which this span does not wait for) and its context
        is carried; without one, the current context is carried as it is.
        """
        carrier: dict[str, str] = {}
        if task is None:
            self._inject(carrier, None)
        else:
            span = self.tracer.start_span(
                f"create {task}",
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": MESSAGING_SYSTEM,
                    "messaging.operation.type": "create",
                    "messaging.operation.name": "enqueue",
                    "messaging.destination.name": task,
                },
            )
            try:
                self._inject(carrier, trace.set_span_in_context(span))
            finally:
                span.end()
        return carrier or None

    def _inject(self, carrier: dict[str, str], ctx: otel_context.Context | None) -> None:
        if self._propagator is not None:
            self._propagator.inject(carrier, context=ctx)
        else:
            propagate.inject(carrier, context=ctx)

    def _extract(self, carrier: Mapping[str, str]) -> otel_context.Context:
        # An explicit empty context: a job enqueued outside any trace starts its own,
        # never a child of whatever the worker's thread happens to hold.
        empty = otel_context.Context()
        if self._propagator is not None:
            return self._propagator.extract(carrier, context=empty)
        return propagate.extract(carrier, context=empty)

    # -- worker (WorkerObserver) -------------------------------------------------------------

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        """Start the attempt's ``process`` span and make it current for the handler."""
        parent = self._extract(payload_extras(job.payload))
        origin = trace.get_current_span(parent).get_span_context()
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.task,
            "messaging.message.id": str(job.id),
            ATTEMPT: job.attempt,
            MAX_ATTEMPTS: job.max_attempts,
        }
        if job.queue_id is not None:
            attributes[QUEUE_ID] = job.queue_id
        if queue_wait is not None:
            attributes[QUEUE_WAIT] = queue_wait
        span = self.tracer.start_span(
            f"process {job.task}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=[Link(origin)] if origin.is_valid else None,
        )
        # The job's baggage (from the payload) stays current with the span.
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        attempt = _Attempt(job.id, span, token)
        attempt.restore = self._current.set(attempt)

    def job_finished(
        self,
        job: ClaimedJob,
        outcome: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """End the attempt's span with its outcome, and restore the handler's context."""
        attempt = self._current.get()
        if attempt is None or attempt.job_id != job.id:
            return
        span = attempt.span
        try:
            span.set_attribute(OUTCOME, outcome.value)
            if outcome in _FAILURES:
                if error is not None:
                    span.record_exception(error)
                    span.set_attribute("error.type", _type_name(error))
                    span.set_status(Status(StatusCode.ERROR, _describe(error)))
                else:
                    span.set_attribute("error.type", "sqla_queue.AttemptFailed")
                    span.set_status(Status(StatusCode.ERROR, outcome.value))
        finally:
            span.end()
            otel_context.detach(attempt.token)
            if attempt.restore is not None:
                self._current.reset(attempt.restore)

    def jobs_lost(self, tasks: Sequence[str]) -> None:
        """Nothing to trace: the lost attempt's span ended (or died) with its worker."""

    # -- lifecycle ---------------------------------------------------------------------------

    def uninstrument(self) -> None:
        """Stop adding trace context to new payloads (workers already given this observer
        keep tracing)."""
        remove_payload_hook(self.payload_hook)


def _type_name(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # an exception whose __str__ raises still gets a status
        text = ""
    name = type(error).__name__
    return f"{name}: {text[:200]}" if text else name


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    propagator: TextMapPropagator | None = None,
    enqueue: bool = True,
) -> Tracing:
    """Trace sqla_queue jobs with OpenTelemetry; returns the worker observer.

    With ``enqueue`` (the default), every payload this process makes from now on carries
    the current trace context (see :class:`Tracing`). Pass the result to workers::

        tracing = instrument()
        worker = queue.worker(SessionLocal, observers=[tracing])

    Call :meth:`Tracing.uninstrument` to stop the enqueue side.
    """
    tracing = Tracing(tracer_provider=tracer_provider, propagator=propagator)
    if enqueue:
        add_payload_hook(tracing.payload_hook)
    return tracing
