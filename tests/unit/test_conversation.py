"""The conversation (:mod:`sqla_queue.conversation`) driven through fake connections.

A flow written once runs the same statements, in the same order, on the sync driver and on
the async one; a wait is spent in the caller's waiter; a failed statement's error reaches
the flow at the ``yield`` that asked for it; :func:`run_flow` joins the caller's
transaction, or opens one of its own on an AUTOCOMMIT connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import MetaData, column, select, table, text

from sqla_queue._binds import one_async_transaction, one_transaction
from sqla_queue.conversation import (
    Flow,
    Step,
    Wait,
    before_first,
    drive,
    drive_async,
    run_flow,
)
from sqla_queue.models import build_tables
from sqla_queue.statements.lifecycle import (
    UNLISTEN_ALL,
    cancel_lock_timeout_sql,
    listen_sql,
)
from sqla_queue.worker import actions

pytestmark = pytest.mark.unit

JOBS = table("jobs", column("id"))
READ = select(JOBS.c.id)
SET = text("SET LOCAL x = 1")
BROKEN = text("SELECT broken")


class Broken(Exception):
    """What the fake raises for :data:`BROKEN`."""


class FakeResult:
    def __init__(self, rows: Sequence[Any] | None) -> None:
        self.rows = rows
        self.returns_rows = rows is not None

    def all(self) -> list[Any]:
        assert self.rows is not None, "a statement without rows has none to fetch"
        return list(self.rows)


class FakeConnection:
    """Answers READ with one row per call so far, SET with no rows; logs all it runs."""

    def __init__(self, *, autocommit: bool = False) -> None:
        self.log: list[Any] = []
        self.connection = SimpleNamespace(dbapi_connection=SimpleNamespace(autocommit=autocommit))

    def execute(self, statement: Any, params: dict[str, Any]) -> FakeResult:
        self.log.append((statement, params))
        if statement is BROKEN:
            raise Broken("no such column")
        if statement is SET:
            return FakeResult(None)
        return FakeResult([(len(self.log),)])

    def exec_driver_sql(self, sql: str) -> None:
        self.log.append(sql)


class FakeAsyncConnection:
    """:class:`FakeConnection`, awaited."""

    def __init__(self, *, autocommit: bool = False) -> None:
        self.sync = FakeConnection(autocommit=autocommit)
        self.sync_connection = self.sync

    @property
    def log(self) -> list[Any]:
        return self.sync.log

    async def execute(self, statement: Any, params: dict[str, Any]) -> FakeResult:
        return self.sync.execute(statement, params)

    async def exec_driver_sql(self, sql: str) -> None:
        self.sync.exec_driver_sql(sql)


def talk(seen: list[Any]) -> Flow[str]:
    """A conversation with every kind of step: rows, no rows, a wait, a pair and a Step."""
    seen.append((yield Step(READ, {"n": 1})))
    seen.append((yield SET, {}))
    seen.append((yield Wait(0.25)))
    seen.append((yield READ, {"n": 2}))
    return "done"


EXPECTED_LOG = [(READ, {"n": 1}), (SET, {}), (READ, {"n": 2})]
EXPECTED_SEEN = [[(1,)], (), (), [(3,)]]


# -- the two drivers ----------------------------------------------------------------------


def test_the_sync_driver_runs_each_step_in_order_and_sends_back_its_rows() -> None:
    connection = FakeConnection()
    waits: list[float] = []
    seen: list[Any] = []
    value = drive(connection, talk(seen), wait=waits.append)  # type: ignore[arg-type]
    assert value == "done"
    assert connection.log == EXPECTED_LOG
    assert seen == EXPECTED_SEEN
    assert waits == [0.25]


async def test_the_async_driver_runs_the_same_conversation_awaiting_each_step() -> None:
    connection = FakeAsyncConnection()
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    seen: list[Any] = []
    value = await drive_async(connection, talk(seen), wait=wait)  # type: ignore[arg-type]
    assert value == "done"
    assert connection.log == EXPECTED_LOG
    assert seen == EXPECTED_SEEN
    assert waits == [0.25]


async def test_the_async_driver_sleeps_on_the_event_loop_by_default() -> None:
    def napping() -> Flow[int]:
        yield Wait(0.0)
        return 7

    assert await drive_async(FakeAsyncConnection(), napping()) == 7  # type: ignore[arg-type]


def forgiving(seen: list[Any]) -> Flow[list[Any]]:
    """Catches the error of one statement and goes on; the next error goes through."""
    try:
        yield BROKEN, {}
    except Broken as exc:
        seen.append(str(exc))
    rows = yield READ, {}
    yield BROKEN, {}
    return list(rows)


def test_a_failed_statement_is_thrown_into_the_flow_sync() -> None:
    connection = FakeConnection()
    seen: list[Any] = []
    with pytest.raises(Broken, match="no such column"):
        drive(connection, forgiving(seen))  # type: ignore[arg-type]
    assert seen == ["no such column"]
    assert connection.log == [(BROKEN, {}), (READ, {}), (BROKEN, {})]


async def test_a_failed_statement_is_thrown_into_the_flow_async() -> None:
    connection = FakeAsyncConnection()
    seen: list[Any] = []
    with pytest.raises(Broken, match="no such column"):
        await drive_async(connection, forgiving(seen))  # type: ignore[arg-type]
    assert seen == ["no such column"]
    assert connection.log == [(BROKEN, {}), (READ, {}), (BROKEN, {})]


def test_a_flow_that_returns_at_once_runs_nothing() -> None:
    def silent() -> Flow[None]:
        return
        yield READ, {}  # a generator, all the same

    connection = FakeConnection(autocommit=True)
    assert drive(connection, silent()) is None  # type: ignore[arg-type]
    assert connection.log == []


def test_a_wait_is_one_type_for_flows_and_the_worker() -> None:
    assert actions.Wait is Wait
    assert Wait(2.0) == Wait(2.0) and Wait(2.0).seconds == 2.0
    statement, params = Step(READ, {"n": 1})
    assert (statement, params) == (READ, {"n": 1})


# -- run_flow and the transaction of its own ----------------------------------------------


def test_run_flow_joins_the_callers_transaction() -> None:
    connection = FakeConnection()
    assert run_flow(connection, talk([])) == "done"  # type: ignore[arg-type]
    assert connection.log == EXPECTED_LOG  # no BEGIN, no COMMIT


def test_run_flow_on_autocommit_writes_whole_or_not_at_all() -> None:
    connection = FakeConnection(autocommit=True)
    assert run_flow(connection, talk([])) == "done"  # type: ignore[arg-type]
    assert connection.log == ["BEGIN", *EXPECTED_LOG, "COMMIT"]

    connection = FakeConnection(autocommit=True)
    with pytest.raises(Broken):
        run_flow(connection, forgiving([]))  # type: ignore[arg-type]
    assert connection.log == ["BEGIN", (BROKEN, {}), (READ, {}), (BROKEN, {}), "ROLLBACK"]


async def test_one_async_transaction_begins_only_on_autocommit_and_when_needed() -> None:
    for autocommit, needed, opened in [
        (True, True, True),
        (True, False, False),
        (False, True, False),
    ]:
        connection = FakeAsyncConnection(autocommit=autocommit)
        async with one_async_transaction(connection, needed=needed):  # type: ignore[arg-type]
            await connection.exec_driver_sql("work")
        assert connection.log == (["BEGIN", "work", "COMMIT"] if opened else ["work"])
    connection = FakeAsyncConnection(autocommit=True)
    with pytest.raises(Broken):
        async with one_async_transaction(connection):  # type: ignore[arg-type]
            raise Broken
    assert connection.log == ["BEGIN", "ROLLBACK"]


def test_one_transaction_keeps_the_blocks_error_when_the_rollback_fails_too() -> None:
    class Gone(FakeConnection):
        def exec_driver_sql(self, sql: str) -> None:
            super().exec_driver_sql(sql)
            if sql == "ROLLBACK":
                raise OSError("connection lost")

    connection = Gone(autocommit=True)
    with pytest.raises(Broken), one_transaction(connection):  # type: ignore[arg-type]
        raise Broken
    assert connection.log == ["BEGIN", "ROLLBACK"]


# -- before_first -------------------------------------------------------------------------


def writes(seen: list[Any]) -> Flow[int]:
    yield READ, {}
    seen.append((yield SET, {"chunk": 1}))
    yield SET, {"chunk": 2}
    return 3


def test_before_first_runs_the_prelude_once_just_before_the_statement() -> None:
    called: list[bool] = []

    def prelude() -> Flow[object]:
        called.append(True)
        yield Wait(0.5)
        yield READ, {"prelude": True}
        return None

    connection = FakeConnection()
    waits: list[float] = []
    seen: list[Any] = []
    flow = before_first(writes(seen), SET, prelude)
    assert drive(connection, flow, wait=waits.append) == 3  # type: ignore[arg-type]
    assert connection.log == [
        (READ, {}),
        (READ, {"prelude": True}),
        (SET, {"chunk": 1}),
        (SET, {"chunk": 2}),
    ]
    assert called == [True]
    assert waits == [0.5]
    assert seen == [()]  # the inner flow gets its own statement's rows, not the prelude's


def test_before_first_never_calls_the_prelude_when_the_statement_never_runs() -> None:
    def prelude() -> Flow[object]:
        raise AssertionError("not needed")

    connection = FakeConnection()
    assert drive(connection, before_first(writes([]), BROKEN, prelude)) == 3  # type: ignore[arg-type]


def test_before_first_hands_a_statements_error_to_the_inner_flow() -> None:
    connection = FakeConnection()
    seen: list[Any] = []

    def nothing() -> Flow[object]:
        yield from ()
        return None

    with pytest.raises(Broken):
        drive(connection, before_first(forgiving(seen), READ, nothing))  # type: ignore[arg-type]
    assert seen == ["no such column"]


# -- the driver SQL of queue.result and queue.cancel --------------------------------------


def test_the_lifecycle_driver_sql() -> None:
    tables = build_tables(MetaData())
    assert cancel_lock_timeout_sql(10) == "SET LOCAL lock_timeout = '10.0s'"
    assert listen_sql(tables) == f'LISTEN "{tables.finished_channel}"'
    odd = SimpleNamespace(finished_channel='say "hi"')
    assert listen_sql(odd) == 'LISTEN "say ""hi"""'  # type: ignore[arg-type]
    assert UNLISTEN_ALL == "UNLISTEN *"
