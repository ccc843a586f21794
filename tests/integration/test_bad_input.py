"""Bad input is refused at the door, by name, and changes nothing (issue 12).

Every case below makes one bad call: a value out of range, of the wrong type, or one
PostgreSQL cannot store. Each must raise the expected exception, with a message naming
the value and the rule, before anything is written. The test then proves the database
unchanged and the caller's business transaction intact: a row added after the error
commits together with the one added before it, and no job or execution appeared.

To add a case, append a :class:`Case` to ``CASES``: a readable id, the call (given a
:class:`Ctx`), the exception type and a regular expression its message must match. A
case that needs the database arranged first gives ``prepare``, run as the owner.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, MetaData, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    InvalidIdentifierError,
    JobSpec,
    PayloadNotSerializableError,
    Queue,
    RetryPolicy,
    UnknownTaskError,
)
from tests.support.app import QUEUE_SCHEMA, Order, noop, queue, record, record_async

pytestmark = pytest.mark.integration

UTC = dt.UTC
#: Rows per statement of a bulk enqueue (sqla_queue.enqueue.CHUNK_SIZE).
CHUNK = 5_000


@dataclass
class Ctx:
    """What a case's call gets: the test app's database, and a business transaction open.

    ``session`` has already written one ``Order`` (flushed), so its transaction is real
    on the server: an error that aborted it would make the final commit fail.
    """

    engine: Engine
    db_url: str
    session: Session
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    def fresh_queue(self, **settings: Any) -> Queue:
        """A queue of its own (on a fresh MetaData) to register tasks on."""
        return Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, **settings)

    def autocommit(self) -> Connection:
        """A connection in AUTOCOMMIT mode, closed after the case."""
        connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self._cleanups.append(connection.close)
        return connection

    def async_session(self) -> AsyncSession:
        """An AsyncSession that never connects: the refusals happen before any I/O."""
        return AsyncSession(create_async_engine(self.db_url))


@dataclass(frozen=True)
class Case:
    """One bad call and what it must raise."""

    id: str
    call: Callable[[Ctx], object]
    raises: type[BaseException]
    match: str
    #: Arrange the database first (as its owner), for a case that needs it.
    prepare: Callable[[Connection], None] | None = None


def handler(value: Any = None) -> None:
    """A handler for the registration cases."""


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` levels deep (built without recursion)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def register(**settings: Any) -> Callable[[Ctx], object]:
    """The call ``@fresh_queue.task(**settings)`` on :func:`handler`."""
    return lambda c: c.fresh_queue().task(**settings)(handler)


def poison_check(connection: Connection) -> None:
    """A host's own rule on the jobs table: the database refuses one payload value."""
    connection.execute(
        text(
            f"ALTER TABLE {QUEUE_SCHEMA}.{queue.tables.jobs.name} ADD CONSTRAINT poison_ck "
            "CHECK ((payload #>> '{kwargs,value}') IS DISTINCT FROM 'poison')"
        )
    )


def bulk_with_poison_in_second_chunk(c: Ctx) -> object:
    """A batch of two chunks on an AUTOCOMMIT connection whose second one fails."""
    specs = [noop.call() for _ in range(CHUNK)] + [record.call(value="poison")]
    return queue.enqueue_many(c.autocommit(), specs)


INT4 = r"-2147483648 to 2147483647"
#: 1,000 distinct CJK characters: 3,000 bytes that do not compress below the btree limit.
UNINDEXABLE_KEY = "".join(map(chr, range(0x4E00, 0x4E00 + 1000)))

CASES: list[Case] = [
    # -- item 1: due times beyond what PostgreSQL and Python both hold, in every zone ----
    Case(
        "delay-1e12-seconds",
        lambda c: noop.options(delay=1e12).enqueue(c.session),
        ValueError,
        r"delay must be at most \d+ seconds",
    ),
    Case(
        "delay-timedelta-max",
        lambda c: noop.options(delay=dt.timedelta.max).enqueue(c.session),
        ValueError,
        r"delay must be at most",
    ),
    Case(
        "delay-by-name-1e12",
        lambda c: queue.enqueue(c.session, "noop", delay=1e12),
        ValueError,
        r"delay must be at most",
    ),
    Case(
        "delay-nan",
        lambda c: noop.options(delay=math.nan).enqueue(c.session),
        ValueError,
        r"delay must be a finite number of seconds, got nan",
    ),
    Case(
        "delay-inf",
        lambda c: noop.options(delay=math.inf).enqueue(c.session),
        ValueError,
        r"delay must be a finite number",
    ),
    Case(
        "delay-string",
        lambda c: noop.options(delay="60").enqueue(c.session),  # type: ignore[arg-type]
        TypeError,
        r"delay must be a number of seconds .*or a timedelta, got '60' \(str\)",
    ),
    Case(
        "delay-bool",
        lambda c: noop.options(delay=True).enqueue(c.session),
        TypeError,
        r"delay must be a number of seconds.*got True \(bool\)",
    ),
    Case(
        "delay-negative-timedelta",
        lambda c: noop.options(delay=dt.timedelta(seconds=-1)).enqueue(c.session),
        ValueError,
        r"delay must be non-negative",
    ),
    Case(
        "run_at-datetime-max",
        lambda c: noop.options(run_at=dt.datetime.max.replace(tzinfo=UTC)).enqueue(c.session),
        ValueError,
        r"run_at must be from 0002-01-01.* to before 9999-01-01.*got 9999-12-31",
    ),
    Case(
        "run_at-datetime-min",
        lambda c: noop.options(run_at=dt.datetime.min.replace(tzinfo=UTC)).enqueue(c.session),
        ValueError,
        r"run_at must be from 0002-01-01",
    ),
    Case(
        "run_at-string",
        lambda c: noop.options(run_at="2030-01-01T00:00:00Z").enqueue(c.session),  # type: ignore[arg-type]
        TypeError,
        r"run_at must be a timezone-aware datetime, got '2030-01-01T00:00:00Z' \(str\)",
    ),
    Case(
        "run_at-date",
        lambda c: noop.options(run_at=dt.date(2030, 1, 1)).enqueue(c.session),  # type: ignore[arg-type]
        TypeError,
        r"run_at must be a timezone-aware datetime, got .*\(date\)",
    ),
    # -- item 6: what PostgreSQL cannot store, refused before the write ------------------
    Case(
        "nul-in-argument",
        lambda c: record.enqueue(c.session, value="a\x00b"),
        PayloadNotSerializableError,
        r"'record'.*arguments\['kwargs'\]\['value'\] = 'a\\x00b' contains a NUL",
    ),
    Case(
        "nul-in-key",
        lambda c: record.enqueue(c.session, value={"k\x00": 1}),  # type: ignore[arg-type]
        PayloadNotSerializableError,
        r"\['value'\] key 'k\\x00' contains a NUL",
    ),
    Case(
        "nul-in-positional-argument-by-name",
        lambda c: queue.enqueue(c.session, "record", args=["\x00"]),
        PayloadNotSerializableError,
        r"arguments\['args'\]\[0\] = .*NUL",
    ),
    Case(
        "lone-surrogate",
        lambda c: record.enqueue(c.session, value="\ud800"),
        PayloadNotSerializableError,
        r"\['value'\] = .* surrogate code point U\+D800",
    ),
    Case(
        "lone-low-surrogate-nested",
        lambda c: record.enqueue(c.session, value=["ok", {"x": "ab\udfff"}]),  # type: ignore[arg-type]
        PayloadNotSerializableError,
        r"\['value'\]\[1\]\['x'\] = .*U\+DFFF at index 2",
    ),
    Case(
        "lone-low-surrogate-after-an-emoji",
        lambda c: record.enqueue(c.session, value="\U0001f600\udc00"),
        PayloadNotSerializableError,
        r"lone surrogate code point U\+DC00 at index 1",
    ),
    Case(
        "lone-surrogate-after-a-literal-backslash-u",
        # The text "\ud800" then a real lone low surrogate: the JSON text shows
        # "\\ud800\udc00", which must not pass for a pair.
        lambda c: record.enqueue(c.session, value="\\ud800\udc00"),
        PayloadNotSerializableError,
        r"lone surrogate code point U\+DC00 at index 6",
    ),
    Case(
        "nul-in-queue_id",
        lambda c: record.options(queue_id="a\x00").enqueue(c.session),
        PayloadNotSerializableError,
        r"queue_id 'a\\x00' contains a NUL",
    ),
    Case(
        "surrogate-in-queue_id",
        lambda c: queue.enqueue(c.session, "record", queue_id="k\udc00"),
        PayloadNotSerializableError,
        r"queue_id .* surrogate",
    ),
    Case(
        "queue_id-too-long-to-index",
        lambda c: record.options(queue_id=UNINDEXABLE_KEY).enqueue(c.session),
        ValueError,
        r"queue_id must be at most 512 characters",
    ),
    Case(
        "nested-5000-deep",
        lambda c: record.enqueue(c.session, value=nested(5000)),  # type: ignore[arg-type]
        PayloadNotSerializableError,
        r"'record'.*more than 200 levels deep",
    ),
    Case(
        "nested-300-deep",
        lambda c: record.enqueue(c.session, value=nested(300)),  # type: ignore[arg-type]
        PayloadNotSerializableError,
        r"arguments\['kwargs'\]\['value'\]\[0\].*more than 200 levels deep",
    ),
    Case(
        "int-key",
        lambda c: record.enqueue(c.session, value={1: "a"}),  # type: ignore[arg-type]
        PayloadNotSerializableError,
        r"\['value'\] key 1 \(type int\) is not a string.*come back as '1'",
    ),
    Case(
        "none-key",
        lambda c: record.enqueue(c.session, value={None: "a"}),  # type: ignore[arg-type]
        PayloadNotSerializableError,
        r"key None \(type NoneType\) is not a string.*'null'",
    ),
    Case(
        "int-keyword-by-name",
        lambda c: queue.enqueue(c.session, "record", {1: "a"}),  # type: ignore[dict-item]
        PayloadNotSerializableError,
        r"arguments\['kwargs'\] key 1 \(type int\) is not a string",
    ),
    Case(
        "int-keyword-in-a-jobspec",
        lambda c: queue.enqueue_many(c.session, [JobSpec("record", (), {2: "a"})]),  # type: ignore[dict-item]
        PayloadNotSerializableError,
        r"'record'.*key 2 \(type int\) is not a string",
    ),
    Case(
        "bulk-nul-in-the-last-spec",
        lambda c: queue.enqueue_many(
            c.session, [noop.call() for _ in range(25)] + [record.call(value="\x00")]
        ),
        PayloadNotSerializableError,
        r"'record'.*NUL",
    ),
    Case(
        "bulk-on-autocommit-is-all-or-nothing",
        bulk_with_poison_in_second_chunk,
        IntegrityError,
        r"poison_ck",
        prepare=poison_check,
    ),
    Case(
        "async-session-nul",
        lambda c: record_async.enqueue(c.async_session(), value="\x00"),
        PayloadNotSerializableError,
        r"'record_async'.*NUL",
    ),
    Case(
        "args-as-a-string-by-name",
        lambda c: queue.enqueue(c.session, "record", args="abc"),
        TypeError,
        r"args must be a list or tuple",
    ),
    # -- item 7: options and settings, refused where they are given ----------------------
    Case(
        "option-priority-2**40",
        lambda c: noop.options(priority=2**40).enqueue(c.session),
        ValueError,
        rf"priority must be from {INT4} \(it is stored as a PostgreSQL integer\)",
    ),
    Case(
        "option-priority-string-by-name",
        lambda c: queue.enqueue(c.session, "noop", priority="high"),  # type: ignore[arg-type]
        TypeError,
        r"priority must be a whole number \(int\), got 'high' \(str\)",
    ),
    Case(
        "option-max_attempts-2.5",
        lambda c: noop.options(max_attempts=2.5).enqueue(c.session),  # type: ignore[arg-type]
        TypeError,
        r"max_attempts must be a whole number \(int\), got 2.5",
    ),
    Case(
        "option-max_attempts-True",
        lambda c: queue.enqueue(c.session, "noop", max_attempts=True),
        TypeError,
        r"max_attempts must be a whole number \(int\), got True",
    ),
    Case(
        "option-max_attempts-2**31",
        lambda c: noop.options(max_attempts=2**31).enqueue(c.session),
        ValueError,
        r"max_attempts must be from 1 to 2147483647",
    ),
    Case(
        "task-priority-string",
        register(priority="x"),
        TypeError,
        r"priority must be a whole number \(int\), got 'x'",
    ),
    Case(
        "task-priority-2**40",
        register(priority=2**40),
        ValueError,
        rf"priority must be from {INT4}",
    ),
    Case(
        "task-max_attempts-2.5",
        register(max_attempts=2.5),
        TypeError,
        r"max_attempts must be a whole number \(int\), got 2.5",
    ),
    Case(
        "task-max_attempts-True",
        register(max_attempts=True),
        TypeError,
        r"max_attempts must be a whole number",
    ),
    Case(
        "task-max_attempts-0",
        register(max_attempts=0),
        ValueError,
        r"max_attempts must be at least 1, got 0",
    ),
    Case(
        "task-lost_interval-nan",
        register(lost_interval=math.nan),
        ValueError,
        r"lost_interval must be a finite number of seconds, got nan",
    ),
    Case(
        "task-lost_interval-inf",
        register(lost_interval=math.inf),
        ValueError,
        r"lost_interval must be a finite number",
    ),
    Case(
        "task-lost_interval-negative",
        register(lost_interval=-1),
        ValueError,
        r"lost_interval must be positive, got -1",
    ),
    Case(
        "task-lost_interval-string",
        register(lost_interval="5"),
        TypeError,
        r"lost_interval must be a number of seconds \(int or float\), got '5'",
    ),
    Case(
        "task-lost_interval-beyond-a-year",
        register(lost_interval=1e12),
        ValueError,
        r"lost_interval must be at most 31536000 seconds",
    ),
    Case(
        "task-max_reclaims-negative",
        register(max_reclaims=-1),
        ValueError,
        r"max_reclaims must be at least 0, got -1",
    ),
    Case(
        "task-max_reclaims-2.5",
        register(max_reclaims=2.5),
        TypeError,
        r"max_reclaims must be a whole number",
    ),
    Case(
        "task-retry-not-a-policy",
        register(retry=5),
        TypeError,
        r"retry must be a RetryPolicy, got 5",
    ),
    Case(
        "task-pass_context-not-a-bool",
        register(pass_context="yes"),
        TypeError,
        r"pass_context must be True or False",
    ),
    Case(
        "task-concurrency_limit-2**31",
        register(concurrency_limit=2**31),
        ValueError,
        r"concurrency limit must be a whole number from 1 to 2147483647",
    ),
    Case(
        # item 9: an empty name was silently replaced by the function's name.
        "task-name-empty",
        register(name=""),
        InvalidIdentifierError,
        r"task name must be a non-empty string, got ''",
    ),
    Case(
        "declare_task-priority-string",
        lambda c: c.fresh_queue().declare_task("x", priority="high"),  # type: ignore[arg-type]
        TypeError,
        r"priority must be a whole number",
    ),
    Case(
        "declare_task-max_attempts-0",
        lambda c: c.fresh_queue().declare_task("x", max_attempts=0),
        ValueError,
        r"max_attempts must be at least 1",
    ),
    Case(
        "queue-lost_interval-nan",
        lambda c: c.fresh_queue(lost_interval=math.nan),
        ValueError,
        r"lost_interval must be a finite number of seconds, got nan",
    ),
    Case(
        "queue-max_reclaims-negative",
        lambda c: c.fresh_queue(max_reclaims=-1),
        ValueError,
        r"max_reclaims must be at least 0",
    ),
    Case(
        "queue-max_attempts-2.5",
        lambda c: c.fresh_queue(max_attempts=2.5),
        TypeError,
        r"max_attempts must be a whole number",
    ),
    Case(
        "queue-retry-not-a-policy",
        lambda c: c.fresh_queue(retry={"min_delay": 1}),
        TypeError,
        r"retry must be a RetryPolicy",
    ),
    # -- item 8: the operators' calls (prune, limits, requeue) ----------------------------
    Case(
        "prune-negative-age",
        lambda c: queue.prune(c.session, older_than=dt.timedelta(days=-1), include_failed=True),
        ValueError,
        r"older_than must not be negative",
    ),
    Case(
        "prune-negative-microsecond",
        lambda c: queue.prune(c.session, older_than=dt.timedelta(microseconds=-1)),
        ValueError,
        r"older_than must not be negative",
    ),
    Case(
        "prune-age-not-a-timedelta",
        lambda c: queue.prune(c.session, older_than=3600),  # type: ignore[arg-type]
        TypeError,
        r"older_than must be a datetime\.timedelta, got 3600",
    ),
    Case(
        "limit-unknown-task",
        lambda c: queue.set_limit(c.session, "no_such_task", 3),
        UnknownTaskError,
        r"cannot store a concurrency limit: unknown task 'no_such_task'.*known tasks",
    ),
    *(
        Case(
            f"limit-{name}",
            lambda c, v=value: queue.set_limit(c.session, "noop", v),
            ValueError,
            rule,
        )
        for name, value, rule in [
            ("beyond-int", 99_999_999_999, r"whole number from 1 to 2147483647, got 99999999999"),
            ("2**31", 2**31, r"whole number from 1 to 2147483647"),
            ("zero", 0, r"whole number from 1 to 2147483647, got 0"),
            ("bool", True, r"got True"),
            ("float", 2.5, r"got 2\.5"),
            ("string", "3", r"got '3'"),
        ]
    ),
    Case(
        "limit-invalid-task-name",
        lambda c: queue.set_limit(c.session, "bad name!", 3),
        InvalidIdentifierError,
        r"bad name!",
    ),
    *(
        Case(f"requeue-{name}", lambda c, v=ids: queue.requeue(c.session, v), error, rule)
        for name, ids, error, rule in [
            (
                "beyond-bigint",
                [2**63],
                ValueError,
                r"a job id must be from -9223372036854775808 to 9223372036854775807 "
                r"\(it is a PostgreSQL bigint\), got 9223372036854775808",
            ),
            ("far-beyond-bigint", [10**30], ValueError, r"PostgreSQL bigint\), got 10{30}"),
            ("below-bigint", [-(2**63) - 1], ValueError, r"bigint\), got -9223372036854775809"),
            ("a-string", "123", TypeError, r"job_ids must be an iterable of job ids, got '123'"),
            ("an-int", 7, TypeError, r"job_ids must be an iterable"),
            ("float-id", [1.5], TypeError, r"a job id must be a whole number \(int\), got 1\.5"),
            ("decimal-id", [Decimal("2.9")], TypeError, r"got Decimal\('2\.9'\) \(Decimal\)"),
            ("whole-decimal-id", [Decimal("2")], TypeError, r"got Decimal\('2'\)"),
            ("fraction-id", [Fraction(5, 2)], TypeError, r"got Fraction\(5, 2\)"),
            ("spaced-text-id", [" 7"], TypeError, r"got ' 7'"),
            ("underscored-text-id", ["1_000"], TypeError, r"got '1_000'"),
            ("non-ascii-digit-id", ["\u0663"], TypeError, r"a job id must be a whole number"),
            ("huge-text-id", ["9" * 5000], ValueError, r"bigint\), got a number of 5000 digits"),
            ("bool-id", [True], TypeError, r"got True"),
            ("text-id", ["x"], TypeError, r"got 'x'"),
        ]
    ),
]


def counts(engine: Engine) -> tuple[int, int, int, int]:
    """Committed jobs, executions, business orders and stored limits."""
    with Session(engine) as session:
        return (
            session.scalar(select(func.count()).select_from(queue.Job)) or 0,
            session.scalar(select(func.count()).select_from(queue.JobExecution)) or 0,
            session.scalar(select(func.count()).select_from(Order)) or 0,
            session.scalar(select(func.count()).select_from(queue.tables.limits)) or 0,
        )


@pytest.fixture
def ctx(engine: Engine, db_url: str) -> Iterator[Ctx]:
    """A business transaction with one order written, and the test app's database."""
    with Session(engine) as session:
        session.add(Order(email="before@example.com"))
        session.flush()
        context = Ctx(engine=engine, db_url=db_url, session=session)
        yield context
        for cleanup in context._cleanups:
            cleanup()


def test_the_case_ids_are_unique() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_bad_input_is_refused_by_name_and_changes_nothing(
    case: Case, ctx: Ctx, owner_engine: Engine
) -> None:
    if case.prepare is not None:
        with owner_engine.begin() as connection:
            case.prepare(connection)
    jobs, executions, orders, limits = counts(ctx.engine)

    with pytest.raises(case.raises, match=case.match):
        case.call(ctx)

    # The business transaction is intact: a row added after the error commits with the
    # one added before it. Nothing else was written.
    ctx.session.add(Order(email="after@example.com"))
    ctx.session.commit()
    assert counts(ctx.engine) == (jobs, executions, orders + 2, limits)


# -- what is still accepted, right up to the limits --------------------------------------


# PostgreSQL accepts session offsets up to 167:59 hours (POSIX "<X>-167:59" is UTC+167:59).
@pytest.mark.parametrize("zone", ["Etc/GMT-14", "Etc/GMT+12", "<X>-167:59", "<Y>+167:59"])
def test_due_times_at_the_bounds_load_in_every_time_zone(engine: Engine, zone: str) -> None:
    from sqla_queue.logic.times import EARLIEST_DUE, LATEST_DUE, MAX_DELAY

    latest = LATEST_DUE - dt.timedelta(microseconds=1)
    with Session(engine) as session, session.begin():
        ids = [
            noop.options(run_at=latest).enqueue(session),
            noop.options(run_at=EARLIEST_DUE).enqueue(session),
            noop.options(delay=MAX_DELAY).enqueue(session),
        ]
    with Session(engine) as session:
        session.execute(text(f"SET TIME ZONE '{zone}'"))
        due = session.execute(
            select(queue.JobExecution.execute_at)
            .where(queue.JobExecution.id.in_(ids))
            .order_by(queue.JobExecution.id)
        ).scalars()
        loaded = list(due)
    assert loaded[:2] == [latest, EARLIEST_DUE]
    assert loaded[2] > dt.datetime.now(UTC) + MAX_DELAY - dt.timedelta(days=1)


def test_values_near_the_rules_are_accepted_unchanged(engine: Engine) -> None:
    from sqla_queue.logic.payload import MAX_DEPTH

    values: list[Any] = [
        "emoji \U0001f600 and accents é",
        "a backslash then u0000: \\u0000 and \\ud800",
        "{braces} [brackets] in text",
        {"nested": {"dict": ["with", {"str": "keys"}]}},
        # args and kwargs take two levels of the stored document.
        nested(MAX_DEPTH - 2),
        [[i] for i in range(1000)],
    ]
    with Session(engine) as session, session.begin():
        ids = [record.enqueue(session, value=value) for value in values]
        many = queue.enqueue_many(session, [record.call(value=value) for value in values])
        # 512 distinct four-byte characters: the longest key, 2,048 bytes, still indexes.
        longest_key = "".join(map(chr, range(0x20000, 0x20000 + 512)))
        keyed = record.options(queue_id=longest_key, priority=-(2**31)).enqueue(session)
        # Two surrogate code points that form a pair are stored as the character they
        # encode, as JSON writes them.
        paired = record.enqueue(session, value="\ud83d\ude00")
    with Session(engine) as session:
        for job_id, value in zip(ids + many, values + values, strict=True):
            job = session.get(queue.Job, job_id)
            assert job is not None and job.payload["kwargs"]["value"] == value
        job = session.get(queue.Job, keyed)
        assert job is not None and job.priority == -(2**31)
        job = session.get(queue.Job, paired)
        assert job is not None and job.payload["kwargs"]["value"] == "\U0001f600"


def test_a_bulk_enqueue_on_autocommit_commits_its_chunks_together(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        ids = queue.enqueue_many(connection, [noop.call() for _ in range(CHUNK + 1)])
    assert len(ids) == CHUNK + 1
    assert counts(engine)[:2] == (CHUNK + 1, CHUNK + 1)


async def test_a_bulk_enqueue_on_an_async_autocommit_connection_is_all_or_nothing(
    async_engine: AsyncEngine, engine: Engine, owner_engine: Engine
) -> None:
    with owner_engine.begin() as connection:
        poison_check(connection)
    specs = [noop.call() for _ in range(CHUNK)] + [record.call(value="poison")]
    async with async_engine.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(IntegrityError, match="poison_ck"):
            await queue.enqueue_many(autocommit, specs)
        # The connection is usable, and a good batch of two chunks is written whole.
        ids = await queue.enqueue_many(autocommit, [*specs[:-1], record.call(value="fine")])
    assert len(ids) == CHUNK + 1
    assert counts(engine)[:2] == (CHUNK + 1, CHUNK + 1)


def test_registration_keeps_valid_settings() -> None:
    fresh = Queue(metadata=MetaData(), lost_interval=5, max_reclaims=0, max_attempts=2)
    task = fresh.task(name="t", priority=-3, lost_interval=1)(handler)
    assert (task.task_options.priority, task.task_options.lost_interval) == (-3, 1.0)
    assert (task.task_options.max_attempts, task.task_options.max_reclaims) == (2, 0)
    assert fresh.task(name="r", retry=RetryPolicy(min_delay=0))(handler).task_options.retry
