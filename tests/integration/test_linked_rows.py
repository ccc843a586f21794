"""Jobs linked to the app's rows (``about=``), queried with the app's own ORM.

The link is two texts on the job (table, key) with no foreign key: these tests write it
through every bind kind, read it back through ``queue.jobs_about`` and the ``Order.jobs``
relationship, delete the row it points at, and check that the lookup is an index scan.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, delete, event, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, joinedload, selectinload, sessionmaker

from tests.support.app import Order, OrderLine, echo, queue
from tests.support.lifecycle import JOBS

pytestmark = pytest.mark.integration

ABOUT_INDEX = f"{JOBS.name}_about_ix"


def linked(session: Session, about: Any) -> list[int]:
    return list(session.scalars(queue.jobs_about(about).with_only_columns(queue.Job.id)))


def stored(engine: Engine, job_id: int) -> tuple[str | None, str | None]:
    with engine.connect() as connection:
        row = connection.execute(
            select(JOBS.c.about_table, JOBS.c.about_key).where(JOBS.c.id == job_id)
        ).one()
    return row.about_table, row.about_key


def test_a_job_about_an_instance_or_a_key(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        order = Order(email="a@example.com")
        session.add(order)
        session.flush()
        by_instance = echo.options(about=order).enqueue(session, value=1)
        by_class = echo.options(about=(Order, order.id)).enqueue(session, value=2)
        by_name = echo.options(about=("orders", order.id)).enqueue(session, value=3)
        by_table = echo.options(about=(Order.__table__, str(order.id))).enqueue(session)
        other = Order(email="b@example.com")
        session.add(other)
        session.flush()
        elsewhere = echo.options(about=other).enqueue(session)
        plain = echo.enqueue(session)
        order_id, other_id = order.id, other.id
    for job_id in (by_instance, by_class, by_name, by_table):
        assert stored(engine, job_id) == ("orders", str(order_id))
    assert stored(engine, plain) == (None, None)
    with SessionLocal() as session:
        order = session.get(Order, order_id)
        assert linked(session, order) == [by_instance, by_class, by_name, by_table]
        assert linked(session, (Order, order_id)) == [by_instance, by_class, by_name, by_table]
        assert linked(session, (Order, other_id)) == [elsewhere]
        assert sorted(linked(session, Order)) == [
            by_instance,
            by_class,
            by_name,
            by_table,
            elsewhere,
        ]
        # A select like any other: filter and order it further.
        newest = session.scalars(
            queue.jobs_about(order)
            .where(queue.Job.status == "queued")
            .order_by(queue.Job.id.desc())
        ).first()
        assert newest is not None and newest.id == by_table


def test_an_unflushed_instance_is_refused(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal() as session:
        order = Order(email="new@example.com")
        session.add(order)
        with pytest.raises(ValueError, match="flush"):
            echo.options(about=order).enqueue(session)
        with pytest.raises(ValueError, match="flush"):
            echo.options(about=Order(id=7, email="x"))
        with pytest.raises(TypeError):
            echo.options(about=Order)
        with pytest.raises(TypeError):
            echo.options(about=(Order, 1, 2))
        with pytest.raises(ValueError):
            echo.options(about=(Order, None))
        with pytest.raises(TypeError):
            echo.options(about=object())
        # Nothing reached the database: the session has no job and no order yet.
        session.flush()
        assert session.scalars(select(queue.Job)).all() == []


def test_a_composite_key(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        line = OrderLine(order_id=1, line_no=2, sku="X")
        twin = OrderLine(order_id=12, line_no=0, sku="Y")
        session.add_all([line, twin])
        session.flush()
        first = echo.options(about=line).enqueue(session)
        second = echo.options(about=(OrderLine, (1, 2))).enqueue(session)
        third = echo.options(about=twin).enqueue(session)
    assert stored(engine, first) == ("order_lines", json.dumps([1, 2]))
    assert stored(engine, second) == stored(engine, first)
    with SessionLocal() as session:
        line = session.get(OrderLine, (1, 2))
        assert linked(session, line) == [first, second]
        assert linked(session, (OrderLine, (12, 0))) == [third]
    with pytest.raises(ValueError, match="composite"):
        queue.about_relationship(OrderLine)


def test_the_relationship_lazy_selectin_and_joined(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        orders = [Order(email=f"{n}@example.com") for n in range(3)]
        session.add_all(orders)
        session.flush()
        ids = {
            order.id: [echo.options(about=order).enqueue(session, value=n) for n in range(k)]
            for k, order in enumerate(orders)
        }
        busiest = orders[2].id
    [first] = ids[busiest][:1]
    assert queue.cancel(engine, [first]) == {first: "cancelled"}  # commits on its own
    with SessionLocal() as session:
        for order in session.scalars(select(Order).order_by(Order.id)):
            assert [job.id for job in order.jobs] == ids[order.id]  # lazy, ordered by id
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with SessionLocal() as session:
        loaded = session.scalars(select(Order).options(selectinload(Order.jobs))).all()
        assert len(statements) == 2  # the orders, then every job of them in one query
        assert {o.id: [j.id for j in o.jobs] for o in loaded} == ids
        assert len(statements) == 2
    with SessionLocal() as session:
        joined = session.scalars(select(Order).options(joinedload(Order.jobs))).unique().all()
        assert {o.id: [j.id for j in o.jobs] for o in joined} == ids
        # "Which orders have a cancelled job?", as a join through the relationship.
        cancelled = session.scalars(
            select(Order.id).join(Order.jobs).where(queue.Job.status == "cancelled")
        ).all()
        assert cancelled == [busiest]
        # And the state of each, loaded with the jobs.
        order = session.scalars(
            select(Order)
            .where(Order.id == busiest)
            .options(selectinload(Order.jobs).selectinload(queue.Job.execution))
        ).one()
        assert [job.state for job in order.jobs] == ["cancelled", "pending"]


def test_a_job_outlives_the_row_it_is_about(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        order = Order(email="gone@example.com")
        session.add(order)
        session.flush()
        job_id = echo.options(about=order).enqueue(session, value="still here")
        order_id = order.id
    with SessionLocal.begin() as session:
        session.execute(delete(Order).where(Order.id == order_id))
    assert queue.worker(SessionLocal).run(burst=True).succeeded == 1
    with SessionLocal() as session:
        assert session.get(Order, order_id) is None
        job = session.get(queue.Job, job_id)
        assert job is not None
        assert (job.status, job.result, job.about_key) == ("succeeded", "still here", str(order_id))
        assert linked(session, (Order, order_id)) == [job_id]


def test_every_bind_kind_and_enqueue_many(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        order = Order(id=41, email="o@example.com")
        session.add(order)
        session.flush()
        batch = queue.enqueue_many(
            session,
            [
                echo.options(about=order).call(value=0),
                echo.call(value=1),
                echo.options(about=(Order, 41), unique_key="o41").call(value=2),
                echo.options(about=(OrderLine, (41, 1))).call(value=3),
            ],
        )
        by_name = queue.enqueue(session, "echo", {"value": 4}, about=(Order, 41))
    with engine.begin() as connection:
        on_connection = echo.options(about=(Order, 41)).enqueue(connection, value=5)
    assert stored(engine, batch[1]) == (None, None)
    assert stored(engine, batch[3]) == ("order_lines", "[41, 1]")
    with SessionLocal() as session:
        assert linked(session, (Order, 41)) == [batch[0], batch[2], by_name, on_connection]


async def test_async_session(
    engine: Engine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    async with AsyncSessionLocal.begin() as session:
        order = Order(email="async@example.com")
        session.add(order)
        await session.flush()
        job_id = await echo.options(about=order).enqueue(session)
        order_id = order.id
    async with AsyncSessionLocal() as session:
        found = (await session.scalars(queue.jobs_about((Order, order_id)))).all()
        assert [job.id for job in found] == [job_id]
        loaded = (
            await session.scalars(
                select(Order).where(Order.id == order_id).options(selectinload(Order.jobs))
            )
        ).one()
        assert [job.id for job in loaded.jobs] == [job_id]


def _explain(session: Session, sql: str, params: Any) -> str:
    """The plan of ``sql`` as the driver sends it, with its parameters."""
    cursor = session.connection().connection.cursor()
    try:
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())
    finally:
        cursor.close()


def _plan(session: Session, statement: Any) -> str:
    compiled = statement.compile(dialect=session.get_bind().dialect)
    return _explain(session, str(compiled), compiled.params)


def test_lookups_use_the_about_index(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        orders = [Order(email=f"{n}@example.com") for n in range(50)]
        session.add_all(orders)
        session.flush()
        # Plenty of jobs about nothing and about other rows: a scan would be costly.
        queue.enqueue_many(session, (echo.call(value=n) for n in range(20_000)))
        queue.enqueue_many(
            session, (echo.options(about=o).call(value=n) for n in range(20) for o in orders)
        )
        target_id = orders[7].id
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text(f"ANALYZE {JOBS.fullname}"))
    with SessionLocal() as session:
        target = session.get(Order, target_id)
        plan = _plan(session, queue.jobs_about(target))
        assert ABOUT_INDEX in plan, plan
        statements: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
            statements.append((statement, params))

        event.listen(engine, "before_cursor_execute", capture)
        try:
            assert len(target.jobs) == 20  # the lazy load
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        [(lazy_sql, lazy_params)] = statements
        lazy_plan = _explain(session, lazy_sql, lazy_params)
        assert ABOUT_INDEX in lazy_plan, lazy_plan
