"""``prune`` covers every table the queue writes, in every history layout (issue 36, §4).

Each layout (plain, partitioned, ``history="none"``) gets a queue of its own, in a fresh
database, with the same two tasks: a durable job that commits a step, waits for a signal
and succeeds, and a value task that workflows chain. A second workflow fails at its first
node. Every row is then aged two days by hand (finish times, steps, signals, workflows),
and ``prune`` must leave only what the age and ``include_failed`` keep, reporting the rows
it removed per table, the same from the API, the CLI, and the Prometheus counter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, MetaData, create_engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import JobContext, Queue
from sqla_queue.admin import PRUNED_TABLES, Pruned
from sqla_queue.metrics.prometheus import PrometheusMetrics
from sqla_queue.testing.databases import DatabaseFactory

pytestmark = pytest.mark.integration

QUIET = {"install_signal_handlers": False, "poll_interval": 0.05}
LAYOUTS = ("plain", "partitioned", "none")


def _make_queue(history: str) -> Queue:
    queue = Queue(metadata=MetaData(), history=history, prefix=f"p{history[:2]}_")

    @queue.task(name="pr_durable", pass_context=True)
    def durable(ctx: JobContext[Session]) -> int:
        first = int(ctx.run_step("charge", lambda: 7))
        payload = ctx.wait_for_signal("go")
        return first + int(payload)

    @queue.task(name="pr_value")
    def value(n: int) -> int:
        return n

    @queue.task(name="pr_fail")
    def fail() -> None:
        raise RuntimeError("out of stock")

    return queue


QUEUES = {history: _make_queue(history) for history in LAYOUTS}


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest, db_factory: DatabaseFactory) -> Iterator[Any]:
    """(queue, engine) of one history layout, in a fresh database."""
    queue = QUEUES[request.param]
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        queue.create_all(connection)
    yield queue, engine
    engine.dispose()
    db_factory.drop(url)


def _burst(queue: Queue, engine: Engine) -> None:
    queue.worker(sessionmaker(engine), **QUIET).run(burst=True)


def _counts(queue: Queue, connection: Connection) -> dict[str, int]:
    """How many rows each table a prune touches holds, by role."""
    return {
        role: int(
            connection.execute(
                select(func.count()).select_from(getattr(queue.tables, role))
            ).scalar_one()
        )
        for role in PRUNED_TABLES
    }


def _fill(queue: Queue, engine: Engine) -> dict[str, int]:
    """A finished durable job (a step and a signal), a succeeded workflow of two nodes
    and a failed one; the ids: ``durable``, ``done`` and ``failed`` (workflows)."""
    with Session(engine) as session, session.begin():
        durable = queue.tasks["pr_durable"].enqueue(session)
        value = queue.tasks["pr_value"]
        done = queue.chain(value.call(1), value.call(2)).enqueue(session)
        failed = queue.chain(queue.tasks["pr_fail"].call(), value.call(3)).enqueue(session)
    _burst(queue, engine)  # the durable job waits for its signal now
    with Session(engine) as session, session.begin():
        assert queue.signal(session, durable, "go", 1).stored
    _burst(queue, engine)
    with engine.connect() as connection:
        status = connection.execute(
            select(queue.tables.jobs.c.status).where(queue.tables.jobs.c.id == durable)
        ).scalar()
    # history="none" deleted the succeeded job's row; its steps and signal stayed.
    assert status == (None if queue.tables.history == "none" else "succeeded")
    return {"durable": durable, "done": done.id, "failed": failed.id}


def _age(queue: Queue, connection: Connection, days: int) -> None:
    """Move every timestamp a prune reads ``days`` into the past."""
    t = queue.tables
    back = dt.timedelta(days=days)
    connection.execute(
        update(t.jobs)
        .where(t.jobs.c.finished_at.is_not(None))
        .values(finished_at=t.jobs.c.finished_at - back)
    )
    connection.execute(update(t.job_steps).values(committed_at=t.job_steps.c.committed_at - back))
    connection.execute(update(t.job_signals).values(sent_at=t.job_signals.c.sent_at - back))
    connection.execute(update(t.workflows).values(created_at=t.workflows.c.created_at - back))


def _workflow_ids(queue: Queue, connection: Connection) -> set[int]:
    return set(connection.execute(select(queue.tables.workflows.c.id)).scalars())


def test_prune_removes_every_table_s_rows_by_the_same_age_rule(layout: Any) -> None:
    queue, engine = layout
    ids = _fill(queue, engine)
    with engine.connect() as connection:
        full = _counts(queue, connection)
    # Something of each kind was written, so each deletion below can be seen.
    assert full["job_steps"] >= 1 and full["job_signals"] == 1
    assert full["workflows"] == 2 and full["workflow_nodes"] == 4
    assert full["workflow_edges"] == 2

    # Young: nothing goes, whatever the layout (the orphaned steps of history="none" too).
    with engine.begin() as connection:
        young = queue.prune(connection, older_than=dt.timedelta(hours=1), include_failed=True)
        assert isinstance(young, Pruned) and young == 0 and young.total == 0
        assert _counts(queue, connection) == full

    with engine.begin() as connection:
        _age(queue, connection, days=2)
    with engine.begin() as connection:
        pruned = queue.prune(connection, older_than=dt.timedelta(days=1))
        left = _counts(queue, connection)
        # The failed workflow keeps every row (its failed job waits for inspection); the
        # durable job's steps and signal and the succeeded workflow are gone.
        assert _workflow_ids(queue, connection) == {ids["failed"]}
    assert left == {
        "jobs": 1,
        "unique_keys": 0,
        "job_steps": 0,
        "job_signals": 0,
        "workflows": 1,
        "workflow_nodes": 2,
        "workflow_edges": 1,
    }
    assert pruned.removed == {role: full[role] - left[role] for role in PRUNED_TABLES}
    assert int(pruned) == pruned.removed["jobs"]

    with engine.begin() as connection:
        last = queue.prune(connection, older_than=dt.timedelta(days=1), include_failed=True)
        assert _counts(queue, connection) == dict.fromkeys(PRUNED_TABLES, 0)
    assert last.removed == left


def test_a_workflow_with_a_live_job_keeps_every_row(layout: Any) -> None:
    """A workflow goes with its last job: a durable node still waiting for its signal
    keeps the workflow's rows and its own step, however old, while its finished parent's
    job is pruned."""
    queue, engine = layout
    t = queue.tables
    with Session(engine) as session, session.begin():
        wf = queue.chain(queue.tasks["pr_value"].call(1), queue.tasks["pr_durable"].call()).enqueue(
            session
        )
    _burst(queue, engine)  # the value node succeeds, the durable one waits
    with engine.begin() as connection:
        _age(queue, connection, days=2)
        before = _counts(queue, connection)
    with engine.begin() as connection:
        pruned = queue.prune(connection, older_than=dt.timedelta(days=1), include_failed=True)
        assert pruned.removed["jobs"] == 1
        assert pruned.removed["workflows"] == pruned.removed["workflow_nodes"] == 0
        assert pruned.removed["workflow_edges"] == pruned.removed["job_steps"] == 0
        assert _workflow_ids(queue, connection) == {wf.id}
        counts = _counts(queue, connection)
    assert counts["workflow_nodes"] == 2 and counts["workflow_edges"] == 1
    assert counts["job_steps"] == before["job_steps"] >= 1 and counts["jobs"] == 1
    assert t.history in LAYOUTS


def test_the_cli_and_the_metrics_say_what_prune_removed(
    layout: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqla_queue.cli.jobs import prune_lines

    queue, engine = layout
    _fill(queue, engine)
    with engine.begin() as connection:
        _age(queue, connection, days=2)
    with engine.begin() as connection:
        pruned = queue.prune(connection, older_than=dt.timedelta(days=1), include_failed=True)
    lines = prune_lines(pruned, queue.tables, dt.timedelta(days=1))
    assert all(len(line) <= 80 for line in lines)
    shown = "\n".join(lines)
    for role in PRUNED_TABLES:
        name = getattr(queue.tables, role).name
        assert f"{name} " in shown
        assert any(
            line.split()[0] == name and line.split()[1] == str(pruned.removed[role])
            for line in lines[1:]
        ), shown

    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    metrics.pruned(pruned, queue.tables)
    for role in PRUNED_TABLES:
        value = registry.get_sample_value(
            "sqla_queue_pruned_rows_total", {"table": getattr(queue.tables, role).name}
        )
        assert value == pruned.removed[role]
