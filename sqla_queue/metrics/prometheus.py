"""Prometheus metrics: counters and histograms from the worker, gauges from the database.

Needs the ``prometheus`` extra (``prometheus_client``). :func:`instrument` returns a
:class:`PrometheusMetrics`; pass it to workers in ``observers=[...]``. Every metric has
one label, ``task``:

========================================  =========  ==========================================
name                                      type       what
========================================  =========  ==========================================
``sqla_queue_jobs_enqueued_total``        counter    jobs this process enqueued (see below)
``sqla_queue_jobs_started_total``         counter    attempts started by this worker
``sqla_queue_jobs_succeeded_total``       counter    attempts that succeeded
``sqla_queue_jobs_failed_total``          counter    attempts that failed the job for good
``sqla_queue_jobs_retried_total``         counter    attempts that failed, to be retried
``sqla_queue_jobs_rescheduled_total``     counter    attempts that asked to run later
``sqla_queue_jobs_cancelled_total``       counter    attempts that stopped, cancelled
``sqla_queue_jobs_lost_total``            counter    lost executions this worker reclaimed
``sqla_queue_job_duration_seconds``       histogram  handler run time, commit included
``sqla_queue_job_queue_wait_seconds``     histogram  from due (or claimed) to started
``sqla_queue_jobs_pending``               gauge      pending executions (scrape-time query)
``sqla_queue_jobs_running``               gauge      running executions (scrape-time query)
``sqla_queue_oldest_due_age_seconds``     gauge      age of the oldest due pending execution
``sqla_queue_pruned_rows_total``          counter    rows a prune removed, label ``table``
========================================  =========  ==========================================

``sqla_queue_pruned_rows_total`` is labelled by ``table`` (the table's name) instead:
after each prune, pass its report to :meth:`PrometheusMetrics.pruned` (a process that
prunes on a schedule reports what each run removed, jobs, keys, durable steps and
signals, and workflows with their nodes and edges).

The gauges come from :class:`QueueStatsCollector`: one bounded query per scrape (see
:mod:`sqla_queue.metrics.stats`), enabled by :meth:`PrometheusMetrics.watch_queue` (or
``instrument(queue=..., engine=...)``). ``sqla_queue_queue_stats_up`` says whether the
last query answered, and ``sqla_queue_queue_stats_seconds`` how long it took.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from sqla_queue.admin import Pruned
from sqla_queue.checks import is_whole_number
from sqla_queue.logic.outcomes import ClaimedJob, OutcomeKind
from sqla_queue.logic.payload import add_payload_hook, remove_payload_hook
from sqla_queue.metrics.stats import DEFAULT_CAP
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.metrics import (
    QueueStatsParams,
    queue_stats_statement,
    statement_timeout_statement,
)
from sqla_queue.statements.planner import planner_guard

__all__ = [
    "DEFAULT_DURATION_BUCKETS",
    "DEFAULT_WAIT_BUCKETS",
    "PrometheusMetrics",
    "QueueStatsCollector",
    "instrument",
    "start_metrics_server",
]

log = logging.getLogger("sqla_queue.metrics")

#: Handler durations, seconds: from a no-op (a few ms) to a long batch job.
DEFAULT_DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
)
#: Queue waits, seconds: a claim within a poll, up to a backlog of an hour.
DEFAULT_WAIT_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)

#: Seconds the scrape-time query may run before the database cancels it.
DEFAULT_STATS_TIMEOUT = 2.0

#: The counter each outcome adds to.
_OUTCOME_COUNTERS = {
    OutcomeKind.SUCCEEDED: "succeeded",
    OutcomeKind.FAILED: "failed",
    OutcomeKind.RETRY: "retried",
    OutcomeKind.RESCHEDULE: "rescheduled",
    OutcomeKind.CANCELLED: "cancelled",
}


class _TaskMetrics:
    """One task's children of every metric, looked up once instead of per job."""

    __slots__ = ("counters", "duration", "started", "wait")

    def __init__(self, metrics: PrometheusMetrics, task: str) -> None:
        self.started = metrics.started.labels(task)
        self.duration = metrics.duration.labels(task)
        self.wait = metrics.queue_wait.labels(task)
        self.counters = {
            kind: getattr(metrics, name).labels(task) for kind, name in _OUTCOME_COUNTERS.items()
        }


class PrometheusMetrics:
    """The Prometheus integration: a worker observer, and an enqueue counter.

    The metrics are registered in ``registry`` (default: ``prometheus_client``'s global
    one, which ``start_http_server`` serves); make one instance per registry.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        namespace: str = "sqla_queue",
        duration_buckets: Sequence[float] = DEFAULT_DURATION_BUCKETS,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
    ) -> None:
        self.registry = REGISTRY if registry is None else registry
        self.namespace = namespace

        def counter(name: str, doc: str) -> Counter:
            return Counter(
                f"jobs_{name}", doc, ["task"], namespace=namespace, registry=self.registry
            )

        self.enqueued_total = counter("enqueued", "Jobs enqueued by this process.")
        self.started = counter("started", "Job attempts started by this worker.")
        self.succeeded = counter("succeeded", "Job attempts that succeeded.")
        self.failed = counter("failed", "Job attempts that failed the job for good.")
        self.retried = counter("retried", "Job attempts that failed and will be retried.")
        self.rescheduled = counter("rescheduled", "Job attempts that asked to run later.")
        self.cancelled = counter("cancelled", "Job attempts that stopped after a cancel.")
        self.lost = counter("lost", "Lost executions of dead workers reclaimed by this worker.")
        self.duration = Histogram(
            "job_duration_seconds",
            "How long a handler ran, its transaction's commit included.",
            ["task"],
            namespace=namespace,
            registry=self.registry,
            buckets=tuple(duration_buckets),
        )
        self.queue_wait = Histogram(
            "job_queue_wait_seconds",
            "How long a job waited to start since it became due.",
            ["task"],
            namespace=namespace,
            registry=self.registry,
            buckets=tuple(wait_buckets),
        )
        self.pruned_rows = Counter(
            "pruned_rows_total",
            "Rows removed by prune, per table.",
            ["table"],
            namespace=namespace,
            registry=self.registry,
        )
        self._tasks: dict[str, _TaskMetrics] = {}
        self._lock = threading.Lock()
        self._collectors: list[QueueStatsCollector] = []

    def _for(self, task: str) -> _TaskMetrics:
        found = self._tasks.get(task)
        if found is None:
            with self._lock:
                found = self._tasks.get(task)
                if found is None:
                    found = self._tasks[task] = _TaskMetrics(self, task)
        return found

    # -- WorkerObserver ----------------------------------------------------------------------

    def job_started(self, job: ClaimedJob, queue_wait: float | None) -> None:
        """Count the attempt; observe its queue wait."""
        metrics = self._for(job.task)
        metrics.started.inc()
        if queue_wait is not None:
            metrics.wait.observe(queue_wait)

    def job_finished(
        self,
        job: ClaimedJob,
        outcome: OutcomeKind,
        duration: float,
        error: BaseException | None,
    ) -> None:
        """Count the outcome; observe the handler's duration (not for a job handed back
        at shutdown, whose handler did not finish)."""
        if outcome is OutcomeKind.RELEASE:
            return
        metrics = self._for(job.task)
        metrics.duration.observe(duration)
        counter = metrics.counters.get(outcome)
        if counter is not None:
            counter.inc()

    def jobs_lost(self, tasks: Sequence[str]) -> None:
        """Count each reclaimed execution under its task."""
        for task in tasks:
            self.lost.labels(task).inc()

    # -- enqueue -----------------------------------------------------------------------------

    def enqueued(self, task: str, count: int = 1) -> None:
        """Count ``count`` jobs of ``task`` enqueued."""
        self.enqueued_total.labels(task).inc(count)

    def payload_hook(self, task: str | None) -> None:
        """Count a payload made for ``task`` as an enqueue (see
        :func:`~sqla_queue.logic.payload.add_payload_hook`); adds nothing to the payload.

        Payloads made without a task name (an argument check) are not counted.
        """
        if task is not None:
            self.enqueued(task)

    # -- prune -------------------------------------------------------------------------------

    def pruned(self, report: Pruned, tables: QueueTables) -> None:
        """Count what one prune removed (``queue.prune``'s report), per table of ``tables``.

        Every table a prune touches gets its child, at zero if nothing left it, so a
        dashboard shows the series from the first prune on.
        """
        for name, count in report.by_table(tables).items():
            self.pruned_rows.labels(name).inc(count)

    # -- gauges ------------------------------------------------------------------------------

    def watch_queue(
        self,
        queue: Any,
        engine: Engine,
        *,
        tasks: Sequence[str] | None = None,
        cap: int = DEFAULT_CAP,
        timeout: float = DEFAULT_STATS_TIMEOUT,
    ) -> QueueStatsCollector:
        """Report the pending/running/oldest-age gauges of ``queue``'s tasks at each scrape.

        ``engine`` is a synchronous engine (with psycopg, the same URL serves sync and
        async engines); each scrape borrows one connection for one query. ``tasks``
        defaults to the queue's registered tasks at scrape time.
        """
        tables: QueueTables = queue.tables
        names: Callable[[], Sequence[str]]
        if tasks is not None:
            fixed = list(tasks)
            names = lambda: fixed  # noqa: E731
        else:
            names = lambda: sorted(queue.tasks)  # noqa: E731
        collector = QueueStatsCollector(
            tables, engine, names, namespace=self.namespace, cap=cap, timeout=timeout
        )
        self.registry.register(collector)
        self._collectors.append(collector)
        return collector

    # -- lifecycle ---------------------------------------------------------------------------

    def uninstrument(self) -> None:
        """Stop counting enqueues and drop the gauges' collectors from the registry."""
        remove_payload_hook(self.payload_hook)
        for collector in self._collectors:
            self.registry.unregister(collector)
        self._collectors.clear()


class QueueStatsCollector(Collector):
    """Gauges read from the database at each scrape, by one bounded query.

    A failing or slow query (cancelled after ``timeout`` seconds) never fails the scrape:
    it is logged, and ``<namespace>_queue_stats_up`` reads 0.
    """

    def __init__(
        self,
        tables: QueueTables,
        engine: Engine,
        tasks: Callable[[], Sequence[str]],
        *,
        namespace: str = "sqla_queue",
        cap: int = DEFAULT_CAP,
        timeout: float = DEFAULT_STATS_TIMEOUT,
    ) -> None:
        if not is_whole_number(cap) or cap < 1:
            raise ValueError(f"cap must be a positive int, got {cap!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.engine = engine
        self.tasks = tasks
        self.cap = int(cap)
        self.timeout = timeout
        self._prefix = namespace
        self._statement = queue_stats_statement(tables)
        self._guard = planner_guard(generic_plans=False)
        self._timeout = statement_timeout_statement(max(1, round(timeout * 1000)))

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        p = self._prefix
        return (
            GaugeMetricFamily(
                f"{p}_jobs_pending",
                f"Pending executions of the task, counted up to {self.cap}.",
                labels=["task"],
            ),
            GaugeMetricFamily(
                f"{p}_jobs_running",
                f"Running executions of the task, counted up to {self.cap}.",
                labels=["task"],
            ),
            GaugeMetricFamily(
                f"{p}_oldest_due_age_seconds",
                "Seconds since the oldest due pending execution of the task became due.",
                labels=["task"],
            ),
        )

    def describe(self) -> Iterable[Metric]:
        """The metric families, without a query (registering must not touch the database)."""
        p = self._prefix
        return [
            *self._families(),
            GaugeMetricFamily(f"{p}_queue_stats_up", "1 if the last queue stats query answered."),
            GaugeMetricFamily(f"{p}_queue_stats_seconds", "Time of the queue stats query."),
        ]

    def collect(self) -> Iterable[Metric]:
        """Run the query and yield the gauges. Never raises."""
        p = self._prefix
        up = GaugeMetricFamily(f"{p}_queue_stats_up", "1 if the last queue stats query answered.")
        took = GaugeMetricFamily(f"{p}_queue_stats_seconds", "Time of the queue stats query.")
        began = time.perf_counter()
        try:
            rows = self.read()
        except Exception as exc:
            log.warning("the queue stats query of a metrics scrape failed: %s", exc)
            up.add_metric([], 0)
            return [up]
        pending, running, oldest = self._families()
        for row in rows:
            pending.add_metric([row.task], row.pending)
            running.add_metric([row.task], row.running)
            oldest.add_metric([row.task], float(row.oldest_due_age or 0.0))
        up.add_metric([], 1)
        took.add_metric([], time.perf_counter() - began)
        return [pending, running, oldest, up, took]

    def read(self) -> list[Any]:
        """The query's rows, in a read-only transaction of its own."""
        names = list(self.tasks())
        if not names:
            return []
        params = QueueStatsParams(tasks=names, cap=self.cap)
        # SET LOCAL (the guard, the timeout) lasts for this transaction only.
        with self.engine.connect() as connection, connection.begin():
            connection.execute(self._guard)
            connection.execute(self._timeout)
            return list(connection.execute(self._statement, params))


def start_metrics_server(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> Any:
    """Serve ``registry`` (default: the global one) at ``http://host:port/metrics`` from a
    daemon thread; returns ``prometheus_client``'s server object (``.shutdown()`` stops it).

    Bound to the loopback interface by default: metrics name tasks and volumes, which a
    public interface should not show to anyone who asks.
    """
    result = start_http_server(port, addr=host, registry=REGISTRY if registry is None else registry)
    # prometheus_client >= 0.17 returns (server, thread); older versions return None.
    return result[0] if isinstance(result, tuple) else result


def instrument(
    *,
    registry: CollectorRegistry | None = None,
    queue: Any = None,
    engine: Engine | None = None,
    enqueue: bool = True,
    **options: Any,
) -> PrometheusMetrics:
    """Export sqla_queue metrics to Prometheus; returns the worker observer.

    With ``enqueue`` (the default), enqueues made in this process are counted. With
    ``queue`` and ``engine``, the scrape-time gauges are added (see
    :meth:`PrometheusMetrics.watch_queue`). ``options`` go to :class:`PrometheusMetrics`.
    """
    metrics = PrometheusMetrics(registry=registry, **options)
    if queue is not None and engine is not None:
        metrics.watch_queue(queue, engine)
    if enqueue:
        add_payload_hook(metrics.payload_hook)
    return metrics
