"""``sqla-queue worker --metrics-port``: metrics for a worker started from the command line.

Kept apart from :mod:`sqla_queue.metrics.prometheus` so that the CLI can import it without
``prometheus_client`` and say which extra is missing.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from sqla_queue.errors import SqlaQueueError
from sqla_queue.instrumentation import WorkerObserver

__all__ = ["serve_worker_metrics"]

log = logging.getLogger("sqla_queue.metrics")


def serve_worker_metrics(queue: Any, url: str, *, port: int, host: str) -> list[WorkerObserver]:
    """Start the metrics endpoint for a CLI worker; return the observers to give it.

    Serves ``http://host:port/metrics`` from a daemon thread, with the worker's counters and
    histograms and the queue's scrape-time gauges. Raises :class:`SqlaQueueError` when
    ``prometheus_client`` is missing or the port cannot be bound.
    """
    try:
        from sqla_queue.metrics import prometheus
    except ImportError as exc:
        raise SqlaQueueError(
            f"--metrics-port needs prometheus_client ({exc}); "
            "install it with: pip install 'sqla-queue[prometheus]'"
        ) from None
    metrics = prometheus.PrometheusMetrics()
    engine = _stats_engine(url)
    if engine is not None:
        metrics.watch_queue(queue, engine)
    try:
        prometheus.start_metrics_server(port, host)
    except OSError as exc:
        metrics.uninstrument()
        raise SqlaQueueError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    log.info("serving metrics at http://%s:%d/metrics", host, port)
    return [metrics]


def _stats_engine(url: str) -> Engine | None:
    """A synchronous engine for the scrape-time query, or None (gauges left out).

    Without a pool: a scrape every few seconds does not need a connection held open between
    scrapes. An async-only driver (asyncpg) is swapped for psycopg when it is installed.
    """
    parsed = make_url(url)
    engine = create_engine(parsed, poolclass=NullPool)
    if not engine.dialect.is_async:
        return engine
    engine.dispose()
    if importlib.util.find_spec("psycopg") is None:
        log.warning(
            "the queue gauges need a synchronous driver; %s is async-only and psycopg is "
            "not installed, so the metrics leave them out",
            parsed.drivername,
        )
        return None
    return create_engine(parsed.set(drivername="postgresql+psycopg"), poolclass=NullPool)
