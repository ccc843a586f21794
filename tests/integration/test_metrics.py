"""Prometheus metrics against real PostgreSQL, scraped over HTTP like Prometheus would.

The counters and histograms must match what the workers ran (read back from the jobs
table), the scrape-time gauges what the executions table holds, for both worker faces.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.logic.payload import add_payload_hook
from sqla_queue.metrics.prometheus import PrometheusMetrics, start_metrics_server
from tests.support import observability_app as app
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def scrape(port: int) -> Samples:
    """GET /metrics with a real HTTP client, parsed into (name, labels) -> value."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10.0)
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, task: str | None = None, **labels: str) -> float:
    key = {**labels, **({"task": task} if task else {})}
    return samples.get((name, tuple(sorted(key.items()))), 0.0)


@pytest.fixture
def tables(engine: Engine) -> None:
    with engine.begin() as connection:
        app.create_tables(connection)


@pytest.fixture
def metrics(engine: Engine, tables: None) -> Iterator[tuple[PrometheusMetrics, int]]:
    """Metrics in a registry of their own, served on a free loopback port."""
    registry = CollectorRegistry()
    observer = PrometheusMetrics(registry=registry)
    observer.watch_queue(app.queue, engine, timeout=5.0)
    add_payload_hook(observer.payload_hook)
    port = free_port()
    server = start_metrics_server(port, "127.0.0.1", registry)
    yield observer, port
    server.shutdown()
    observer.uninstrument()


def job_counts(session: Session, task: str) -> dict[str, Any]:
    job = app.queue.Job
    rows = session.execute(
        select(job.status, func.count(), func.sum(job.attempts))
        .where(job.task == task)
        .group_by(job.status)
    ).all()
    return {status: (count, attempts) for status, count, attempts in rows}


def finished(SessionLocal: sessionmaker[Session], expected: int) -> bool:
    job = app.queue.Job
    with SessionLocal() as session:
        done = session.scalar(select(func.count()).where(job.status.in_(["succeeded", "failed"])))
    return done == expected


def test_sync_worker_metrics_match_what_ran(
    SessionLocal: sessionmaker[Session], metrics: tuple[PrometheusMetrics, int]
) -> None:
    observer, port = metrics
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with SessionLocal.begin() as session:
        for n in range(3):
            app.ok.enqueue(session, n=n)
        for _ in range(2):
            app.fail.enqueue(session)
        app.flaky.enqueue(session)
        # Not run by this worker: due ones (oldest age grows) and scheduled ones.
        app.ok_async.enqueue(session)
        app.ok_async.enqueue(session)
        app.traced.options(run_at=later).enqueue(session)

    worker = app.queue.worker(
        SessionLocal, tasks=["ok", "fail", "flaky"], observers=[observer], concurrency=2
    )
    with worker_thread(worker):
        wait_for(lambda: finished(SessionLocal, 6))
    samples = scrape(port)

    with SessionLocal() as session:
        ok, fail, flaky = (job_counts(session, t) for t in ("ok", "fail", "flaky"))
    assert ok == {"succeeded": (3, 3)} and fail == {"failed": (2, 2)}
    assert flaky == {"succeeded": (1, 2)}

    assert value(samples, "sqla_queue_jobs_started_total", "ok") == 3
    assert value(samples, "sqla_queue_jobs_succeeded_total", "ok") == 3
    assert value(samples, "sqla_queue_jobs_failed_total", "fail") == 2
    assert value(samples, "sqla_queue_jobs_started_total", "flaky") == 2
    assert value(samples, "sqla_queue_jobs_retried_total", "flaky") == 1
    assert value(samples, "sqla_queue_jobs_succeeded_total", "flaky") == 1
    assert value(samples, "sqla_queue_jobs_failed_total", "ok") == 0
    for task, attempts in (("ok", 3), ("fail", 2), ("flaky", 2)):
        assert value(samples, "sqla_queue_job_duration_seconds_count", task) == attempts
        assert value(samples, "sqla_queue_job_queue_wait_seconds_count", task) == attempts
        assert value(samples, "sqla_queue_job_duration_seconds_bucket", task, le="+Inf") == attempts

    # The scrape-time gauges: what the executions table holds now.
    assert value(samples, "sqla_queue_queue_stats_up") == 1
    assert value(samples, "sqla_queue_jobs_pending", "ok_async") == 2
    assert value(samples, "sqla_queue_oldest_due_age_seconds", "ok_async") > 0
    assert value(samples, "sqla_queue_jobs_pending", "traced") == 1
    assert value(samples, "sqla_queue_oldest_due_age_seconds", "traced") == 0
    assert value(samples, "sqla_queue_jobs_pending", "ok") == 0
    assert value(samples, "sqla_queue_jobs_running", "ok") == 0


async def test_async_worker_metrics_match_what_ran(
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    metrics: tuple[PrometheusMetrics, int],
) -> None:
    observer, port = metrics
    with SessionLocal.begin() as session:
        for n in range(4):
            app.ok_async.enqueue(session, n=n)
        app.fail_async.enqueue(session)
        app.ok.enqueue(session)  # a def handler on the async worker

    worker = app.queue.async_worker(AsyncSessionLocal, observers=[observer], concurrency=3)
    run = asyncio.create_task(worker.run())
    try:
        for _ in range(600):
            if await asyncio.to_thread(finished, SessionLocal, 6):
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)
    samples = await asyncio.to_thread(scrape, port)

    assert value(samples, "sqla_queue_jobs_started_total", "ok_async") == 4
    assert value(samples, "sqla_queue_jobs_succeeded_total", "ok_async") == 4
    assert value(samples, "sqla_queue_jobs_failed_total", "fail_async") == 1
    assert value(samples, "sqla_queue_jobs_succeeded_total", "ok") == 1
    assert value(samples, "sqla_queue_job_duration_seconds_count", "ok_async") == 4
    assert value(samples, "sqla_queue_job_queue_wait_seconds_count", "fail_async") == 1
    assert value(samples, "sqla_queue_jobs_pending", "ok_async") == 0
    assert value(samples, "sqla_queue_queue_stats_up") == 1


def test_reclaimed_lost_jobs_are_counted(
    SessionLocal: sessionmaker[Session], metrics: tuple[PrometheusMetrics, int]
) -> None:
    observer, port = metrics
    with SessionLocal.begin() as session:
        lost = app.ok.enqueue(session, n=1)
    ex = app.queue.tables.executions
    with SessionLocal.begin() as session:
        # A worker that died an hour ago, holding the job on a 1-second lease.
        session.execute(
            update(ex)
            .where(ex.c.id == lost)
            .values(
                state="running",
                worker_id=uuid.uuid4(),
                attempt=1,
                lease_seconds=1.0,
                alive_at=func.now() - dt.timedelta(hours=1),
            )
        )
    worker = app.queue.worker(SessionLocal, tasks=["ok"], observers=[observer])
    with worker_thread(worker):
        wait_for(lambda: finished(SessionLocal, 1))
    samples = scrape(port)
    assert value(samples, "sqla_queue_jobs_lost_total", "ok") == 1
    assert value(samples, "sqla_queue_jobs_succeeded_total", "ok") == 1


def test_the_stats_query_failing_does_not_fail_the_scrape(
    SessionLocal: sessionmaker[Session], tables: None
) -> None:
    from sqlalchemy import create_engine

    registry = CollectorRegistry()
    observer = PrometheusMetrics(registry=registry)
    nowhere = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")
    observer.watch_queue(app.queue, nowhere, timeout=1.0)
    port = free_port()
    server = start_metrics_server(port, "127.0.0.1", registry)
    try:
        samples = scrape(port)
    finally:
        server.shutdown()
        nowhere.dispose()
    assert value(samples, "sqla_queue_queue_stats_up") == 0
    assert not any(name == "sqla_queue_jobs_pending" for name, _ in samples)


def test_cli_worker_serves_metrics(
    db_url: str, SessionLocal: sessionmaker[Session], tables: None
) -> None:
    """``sqla-queue worker --metrics-port``: a real worker process, scraped over HTTP."""
    import os
    import signal
    import subprocess
    import sys
    import time

    with SessionLocal.begin() as session:
        for n in range(3):
            app.ok.enqueue(session, n=n)
        app.ok_async.enqueue(session)  # not run: --tasks ok
    port = free_port()
    command = [
        *(sys.executable, "-m", "sqla_queue", "worker", "tests.support.observability_app:queue"),
        *("--url", db_url, "--tasks", "ok", "--metrics-port", str(port)),
    ]
    worker = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
    )
    try:
        samples: Samples = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()[0]
            try:
                samples = scrape(port)
            except httpx.TransportError:
                samples = {}
            if value(samples, "sqla_queue_jobs_succeeded_total", "ok") == 3:
                break
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
    assert value(samples, "sqla_queue_jobs_succeeded_total", "ok") == 3, output
    assert value(samples, "sqla_queue_jobs_started_total", "ok") == 3
    assert value(samples, "sqla_queue_jobs_pending", "ok_async") == 1
    assert value(samples, "sqla_queue_queue_stats_up") == 1
    assert worker.returncode == 0, output


def test_cli_metrics_port_is_checked() -> None:
    from sqla_queue.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["worker", "app:queue", "--metrics-port", "9100"])
    assert (args.metrics_port, args.metrics_host) == (9100, "127.0.0.1")
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "app:queue", "--metrics-port", "70000"])
