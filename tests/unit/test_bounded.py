"""Bounded tasks without a database: option checks, compiled statements, and the flow.

The flow is driven by hand here (each statement answered with made-up rows), so the order
of its statements, its arithmetic and its waiting are pinned without a server; the
integration tests run it against PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue import Queue
from sqla_queue.bounded import BoundedStatements, bounded_flow
from sqla_queue.conversation import Flow
from sqla_queue.conversation import Wait as Sleep
from sqla_queue.errors import IsolationLevelError, QueueFull
from sqla_queue.models import build_tables
from sqla_queue.spec import MAX_WAIT_IF_FULL, EnqueueOptions, make_enqueue_options
from sqla_queue.statements.bounded import (
    BoundLockParams,
    PendingCountParams,
    bound_lock_key,
    bound_lock_statement,
    pending_count_statement,
)

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent / "snapshots"
DIALECT = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]


@pytest.fixture
def tables() -> Any:
    return build_tables(MetaData(), schema="app", prefix="q_")


def compiled(stmt: Any) -> str:
    return str(stmt.compile(dialect=DIALECT))


def one_line(stmt: Any) -> str:
    return " ".join(compiled(stmt).split())


# -- options -----------------------------------------------------------------------------


def fresh_queue() -> Queue:
    return Queue(metadata=MetaData(), schema="app")


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0, ValueError, "max_pending must be at least 1, got 0"),
        (-5, ValueError, "max_pending must be at least 1"),
        (2**31, ValueError, "max_pending must be from 1 to"),
        (True, TypeError, "max_pending must be a whole number"),
        (2.0, TypeError, "max_pending must be a whole number"),
        ("10", TypeError, "max_pending must be a whole number"),
    ],
)
def test_a_bad_max_pending_fails_at_the_decorator_and_the_declaration(
    value: Any, error: type[Exception], words: str
) -> None:
    queue = fresh_queue()
    with pytest.raises(error, match=words):
        queue.task(name="t", max_pending=value)
    with pytest.raises(error, match=words):
        queue.declare_task("t", max_pending=value)
    assert queue.tasks == {}


def test_the_bound_reaches_the_enqueuer_from_registration_and_declaration() -> None:
    queue = fresh_queue()

    @queue.task(name="bounded", max_pending=7)
    def bounded() -> None: ...

    @queue.task(name="plain")
    def plain() -> None: ...

    queue.declare_task("remote", max_pending=1)
    queue.declare_task("remote_plain")
    lookup = bounded.enqueuer.defaults
    assert bounded.task_options.max_pending == 7
    assert plain.task_options.max_pending is None
    assert [lookup(n).max_pending for n in ("bounded", "plain", "remote", "remote_plain")] == [
        7,
        None,
        1,
        None,
    ]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ValueError),
        (math.inf, ValueError),
        (math.nan, ValueError),
        (MAX_WAIT_IF_FULL + 1, ValueError),
        (True, TypeError),
        ("5", TypeError),
    ],
)
def test_a_bad_wait_if_full_fails_at_the_call(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="wait_if_full"):
        make_enqueue_options(wait_if_full=value)
    with pytest.raises(error, match="wait_if_full"):
        EnqueueOptions(wait_if_full=value)


def test_wait_if_full_takes_seconds_or_a_timedelta_and_merges_like_other_options() -> None:
    assert make_enqueue_options(wait_if_full=dt.timedelta(seconds=2.5)).wait_if_full == 2.5
    assert make_enqueue_options(wait_if_full=0).wait_if_full == 0.0
    base = EnqueueOptions(wait_if_full=1.0, priority=3)
    assert base.merged(EnqueueOptions(priority=4)).wait_if_full == 1.0
    assert base.merged(EnqueueOptions(wait_if_full=9)).wait_if_full == 9.0


def test_wait_if_full_is_an_option_of_every_entry_point() -> None:
    queue = fresh_queue()

    @queue.task(name="bounded", max_pending=7)
    def bounded() -> None: ...

    assert bounded.options(wait_if_full=3).call().options.wait_if_full == 3.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'wait_if_ful'"):
        bounded.options(wait_if_ful=3)  # type: ignore[call-arg]


# -- statements --------------------------------------------------------------------------

BUILDERS: dict[str, Callable[[Any], Any]] = {
    "bounded_lock": bound_lock_statement,
    "bounded_count": pending_count_statement,
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_statement_matches_snapshot(tables: Any, name: str) -> None:
    """Regenerate with SQLA_QUEUE_UPDATE_SNAPSHOTS=1 after checking the change is intended."""
    sql = compiled(BUILDERS[name](tables)) + "\n"
    path = SNAPSHOTS / f"{name}.sql"
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        path.write_text(sql)
    assert sql == path.read_text()


@pytest.mark.parametrize(
    ("name", "params"), [("bounded_lock", BoundLockParams), ("bounded_count", PendingCountParams)]
)
def test_the_parameter_records_are_the_statements_binds(
    tables: Any, name: str, params: type
) -> None:
    binds = set(BUILDERS[name](tables).compile(dialect=DIALECT).binds)
    assert binds == set(get_type_hints(params))


def test_the_count_walks_the_three_task_indexes_each_stopped_at_the_cap(tables: Any) -> None:
    sql = one_line(pending_count_statement(tables))
    ex = "app.q_job_executions"
    # Each predicate is the literal one of its partial index (task_claim_ix, seated_ix,
    # task_waiting_ix), with the task as the first column.
    for predicate in (
        f"{ex}.state = 'pending' AND {ex}.slot IS NULL",
        f"{ex}.state = 'pending' AND {ex}.slot IS NOT NULL",
        f"{ex}.state = 'waiting'",
    ):
        assert f"WHERE {ex}.task = %(task)s::VARCHAR AND {predicate} LIMIT %(cap)s" in sql
    assert sql.count("LIMIT %(cap)s::INTEGER") == 3
    assert "running" not in sql
    assert "current_setting('transaction_isolation') AS isolation" in sql


def test_the_lock_is_a_transaction_lock_named_by_queue_and_task(tables: Any) -> None:
    sql = one_line(bound_lock_statement(tables))
    assert sql == "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s::VARCHAR, 0)) AS locked"
    other = build_tables(MetaData(), schema="app", prefix="r_")
    keys = {
        bound_lock_key(tables, "a"),
        bound_lock_key(tables, "b"),
        bound_lock_key(other, "a"),
        bound_lock_key(build_tables(MetaData(), schema="x", prefix="q_"), "a"),
    }
    assert len(keys) == 4


# -- the flow, driven by hand ------------------------------------------------------------

ENQUEUE = object()


def writer(chunks: int) -> Flow[list[int]]:
    ids: list[int] = []
    for n in range(chunks):
        rows = yield ENQUEUE, {"rows": f"chunk{n}"}  # type: ignore[misc]
        ids.extend(r[0] for r in rows)
    return ids


class Driver:
    """Answers a flow's statements: counts from ``counts`` in order, ids for the enqueue."""

    def __init__(self, statements: BoundedStatements, counts: Sequence[int], isolation: str):
        self.statements = statements
        self.counts = list(counts)
        self.isolation = isolation
        self.log: list[Any] = []

    def run(self, flow: Flow[Any]) -> Any:
        rows: Sequence[Any] | None = None
        while True:
            try:
                step = flow.send(rows) if rows is not None else next(flow)
            except StopIteration as done:
                return done.value
            if isinstance(step, Sleep):
                self.log.append(("sleep", step.seconds))
                rows = ()
                continue
            statement, params = step
            if statement is self.statements.lock:
                self.log.append(("lock", params["key"]))
                rows = [(None,)]
            elif statement is self.statements.count:
                self.log.append(("count", params["task"], params["cap"]))
                rows = [(self.counts.pop(0), self.isolation)]
            else:
                self.log.append(("enqueue", params["rows"]))
                rows = [(len(self.log),)]


def run(
    tables: Any,
    counts: Sequence[int],
    *,
    bounds: dict[str, int],
    need: dict[str, int],
    wait: float = 0.0,
    chunks: int = 1,
    isolation: str = "read committed",
) -> tuple[Any, list[Any]]:
    statements = BoundedStatements.build(tables)
    driver = Driver(statements, counts, isolation)
    flow = bounded_flow(
        writer(chunks),
        statements=statements,
        enqueue=ENQUEUE,  # type: ignore[arg-type]
        bounds=bounds,
        need=need,
        wait=wait,
    )
    try:
        return driver.run(flow), driver.log
    except Exception as exc:
        return exc, driver.log


def test_lock_then_count_then_write_when_the_rows_fit(tables: Any) -> None:
    value, log = run(tables, [9], bounds={"t": 10}, need={"t": 1}, chunks=2)
    key = bound_lock_key(tables, "t")
    assert log == [("lock", key), ("count", "t", 10), ("enqueue", "chunk0"), ("enqueue", "chunk1")]
    assert value == [3, 4]


def test_a_call_that_does_not_fit_raises_before_any_write(tables: Any) -> None:
    error, log = run(tables, [8], bounds={"t": 10}, need={"t": 3})
    assert isinstance(error, QueueFull)
    assert (error.task, error.max_pending, error.pending, error.requested) == ("t", 10, 8, 3)
    assert error.waited == 0.0
    assert "'t' is full (max_pending=10)" in str(error)
    assert "wait_if_full" in str(error)
    assert [entry[0] for entry in log] == ["lock", "count"]


def test_a_call_larger_than_the_bound_raises_without_counting(tables: Any) -> None:
    error, log = run(tables, [], bounds={"t": 2}, need={"t": 3}, wait=5.0)
    assert isinstance(error, QueueFull)
    assert "more than the bound itself" in str(error)
    assert [entry[0] for entry in log] == ["lock"]


def test_a_waiting_call_sleeps_between_counts_until_room_appears(tables: Any) -> None:
    value, log = run(tables, [10, 10, 9], bounds={"t": 10}, need={"t": 1}, wait=30.0)
    assert [entry[0] for entry in log] == [
        "lock",
        "count",
        "sleep",
        "count",
        "sleep",
        "count",
        "enqueue",
    ]
    assert all(0 < entry[1] <= 0.1 for entry in log if entry[0] == "sleep")
    assert value == [7]


def test_a_waiting_call_gives_up_at_its_deadline(tables: Any) -> None:
    error, log = run(tables, [10] * 1000, bounds={"t": 10}, need={"t": 1}, wait=0.0)
    assert isinstance(error, QueueFull)
    assert [entry[0] for entry in log] == ["lock", "count"]


def test_two_bounded_tasks_are_locked_in_name_order_and_both_checked(tables: Any) -> None:
    value, log = run(tables, [0, 1], bounds={"b": 5, "a": 2}, need={"a": 1, "b": 4})
    assert log[:2] == [("lock", bound_lock_key(tables, "a")), ("lock", bound_lock_key(tables, "b"))]
    assert log[2:4] == [("count", "a", 2), ("count", "b", 5)]
    assert value == [5]
    error, _ = run(tables, [0, 2], bounds={"b": 5, "a": 2}, need={"a": 1, "b": 4})
    assert isinstance(error, QueueFull)
    assert error.task == "b"


def test_a_task_without_rows_to_write_is_locked_but_not_counted(tables: Any) -> None:
    # A unique call whose key is held writes nothing: the flow's need stays empty.
    value, log = run(tables, [], bounds={"t": 1}, need={})
    assert [entry[0] for entry in log] == ["lock", "enqueue"]
    assert value == [2]


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_a_snapshot_older_than_the_lock_is_refused(tables: Any, level: str) -> None:
    error, log = run(tables, [0], bounds={"t": 10}, need={"t": 1}, isolation=level)
    assert isinstance(error, IsolationLevelError)
    assert level.upper() in str(error)
    assert "READ COMMITTED" in str(error)
    assert "enqueue" not in [entry[0] for entry in log]
