"""Bulk enqueue by COPY: a large batch of plain jobs, written by two COPYs in the caller's
transaction.

The enqueue statement reads its rows from one JSON parameter, which costs the server a
parse of the whole batch, a sort and a ``RETURNING`` walk per table. For a batch of at
least :data:`COPY_MIN_ROWS` plain jobs on a psycopg connection (sync or async), the rows go
by ``COPY ... FROM STDIN`` instead, on the caller's own connection and in its transaction:

1. :data:`~sqla_queue.statements.enqueue.RESERVE_IDS` takes one id per job from the jobs
   table's identity sequence, with the transaction's ``now()``;
2. the jobs rows and their ``pending`` executions are sent by two COPYs inside a
   savepoint, each job with the next id in ascending order, so the ids follow the input
   order as the statement's do;
3. ``pg_notify`` wakes the workers, once, as the statement would.

Names and options are checked before any I/O, as for the statement. The arguments are
serialized and checked block by block while the jobs stream, so that the server parses one
block while the next is made (that overlap is most of the gain over a batch serialized
first); arguments that cannot be stored raise the same
:class:`~sqla_queue.PayloadNotSerializableError`, after a rollback to the savepoint: the
batch leaves nothing behind and the caller's transaction stays usable.

The rows are those the statement writes: the same columns from the same options, the due
time computed from the same ``now()`` (``run_at`` as the same text, ``delay`` rounded to the
microsecond as PostgreSQL rounds an interval), the other columns left to their defaults.

A plain job has no ``queue_id`` (its execution's state depends on its key's head), no
unique key and no bound (those calls never get here). Anything else takes the statement,
and so does a role without ``USAGE`` on the identity sequence (an explicit ``nextval``
needs it, the identity default does not): step 1 then reserves nothing, and the same flow
writes the batch by the statement instead, in the same transaction. The execution option
``sqla_queue_copy=False`` (on an engine, a connection or a session's connection) turns the
COPY road off; :func:`copy_option` says which values it takes (a value that means
neither raises an error before anything is written).

The conversation is written once (:func:`copy_flow`, without I/O) and driven like every
other flow (:func:`sqla_queue.conversation.run_flow`); the COPY is a
:class:`~sqla_queue.conversation.DriverStep` (:class:`CopyIn`), whose two thin methods
differ only as psycopg's sync and async cursors do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import (
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import Executable

from sqla_queue._binds import AnyBind, options_of
from sqla_queue.conversation import DriverStep, Flow
from sqla_queue.errors import PayloadNotSerializableError
from sqla_queue.logic.payload import (
    check_keywords_storable,
    dump_payloads,
    encode_json,
    make_payload,
)
from sqla_queue.models.tables import QueueTables
from sqla_queue.spec import JobSpec
from sqla_queue.statements.enqueue import (
    COPY_RELEASE,
    COPY_ROLLBACK,
    COPY_SAVEPOINT,
    EXECUTIONS_COPY_COLUMNS,
    JOBS_COPY_COLUMNS,
    RESERVE_IDS,
    ReserveParams,
    copy_sql,
)

__all__ = [
    "COPY_MIN_ROWS",
    "COPY_OPTION",
    "CopyIn",
    "CopyRows",
    "copy_flow",
    "copy_names",
    "copy_option",
    "copy_usable",
    "copy_wanted",
]

T = TypeVar("T")

#: The smallest batch written by COPY. COPY's six round trips (reserve, savepoint, two
#: COPYs, release, notify) cost more than the statement's one up to about 150 jobs;
#: measured: 1.2x faster at 500 and 1,000 jobs, 2x at 100,000 (bench.enqueue).
COPY_MIN_ROWS = 500

#: The execution option that turns the COPY road off when set to ``False``.
COPY_OPTION = "sqla_queue_copy"

#: Rows per block handed to the driver: some tens of kilobytes each.
_BLOCK_ROWS = 1_000

_NULL = "\\N"


@dataclass(frozen=True)
class CopyIn(DriverStep):
    """A flow step: run ``sql`` (a ``COPY ... FROM STDIN``) with ``blocks`` as its data.

    The flow is sent ``()`` after it. An error of the driver's reaches the flow as
    SQLAlchemy raises a statement's.
    """

    sql: str
    blocks: Iterable[str]

    def run(self, connection: Connection) -> Sequence[Any]:
        """Stream the blocks through psycopg's COPY on ``connection``'s driver connection."""
        driver: Any = connection.connection.driver_connection
        try:
            with driver.cursor() as cursor, cursor.copy(self.sql) as copy:
                for block in self.blocks:
                    copy.write(block)
        except connection.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(connection.dialect, self, exc) from exc
        return ()

    async def run_async(self, connection: AsyncConnection) -> Sequence[Any]:
        """:meth:`run` through psycopg's async COPY."""
        sync = connection.sync_connection
        assert sync is not None
        driver: Any = sync.connection.driver_connection
        try:
            async with driver.cursor() as cursor, cursor.copy(self.sql) as copy:
                for block in self.blocks:
                    await copy.write(block)
        except sync.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(sync.dialect, self, exc) from exc
        return ()


DefaultsOf = Callable[[str], Any]


def _field(value: str) -> str:
    """``value`` as a field of COPY's text format (its four special characters escaped)."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
        value = value.replace("\r", "\\r")
    return value


def _dialect_and_options(bind: AnyBind) -> tuple[Dialect, Mapping[str, Any]] | None:
    """The dialect and execution options ``bind`` will run with, without I/O (None if
    unknown: a session without a bind)."""
    if isinstance(bind, Connection | AsyncConnection):
        return bind.dialect, options_of(bind)
    session = bind.sync_session if isinstance(bind, AsyncSession) else bind
    try:
        found = session.get_bind()
    except Exception:
        return None
    return found.dialect, found.get_execution_options()


# The spellings of the option that a configuration file or an environment variable gives.
_ON = frozenset({"true", "on", "yes", "1"})
_OFF = frozenset({"false", "off", "no", "0"})


def copy_option(options: Mapping[str, Any]) -> bool:
    """Whether the execution options ``options`` leave the COPY road on.

    :data:`COPY_OPTION` absent: on. Its value is ``True`` or ``False``, or one that says
    the same without doubt: ``1`` or ``0``, or a string ``"true"``/``"false"``,
    ``"on"``/``"off"``, ``"yes"``/``"no"``, ``"1"``/``"0"`` (any case, spaces around
    ignored), as a configuration file would give it. Anything else (``None``, ``2``, a
    float, ``"disabled"``) raises :class:`TypeError` or :class:`ValueError` naming the
    option and what it takes, before anything is written: a value read as "on" where its
    writer meant "off" would leave COPY on without a word.
    """
    if COPY_OPTION not in options:
        return True
    value = options[COPY_OPTION]
    if isinstance(value, bool):
        return value
    takes = "True (COPY on, the default) or False (COPY off)"
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value)
        raise ValueError(f"the execution option {COPY_OPTION} takes {takes}, got {value!r}")
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _ON | _OFF:
            return word in _ON
        raise ValueError(
            f"the execution option {COPY_OPTION} takes {takes}, or one of the strings "
            f"{', '.join(sorted(_ON | _OFF))}; got {value!r}"
        )
    hint = " (leave the option out for the default)" if value is None else ""
    raise TypeError(f"the execution option {COPY_OPTION} takes {takes}, got {value!r}{hint}")


def _psycopg_allowed(dialect: Dialect, options: Mapping[str, Any]) -> bool:
    return copy_option(options) and dialect.driver == "psycopg"


def copy_wanted(bind: AnyBind, specs: Sequence[JobSpec]) -> bool:
    """Whether ``specs`` (no unique key among them) should go by COPY on ``bind``: enough
    of them, none with a ``queue_id``, and a psycopg driver with the option not off.

    The option is checked first, whatever the batch (see :func:`copy_option`): a value
    that means nothing raises before anything is written.
    """
    found = _dialect_and_options(bind)
    allowed = found is not None and _psycopg_allowed(*found)
    if len(specs) < COPY_MIN_ROWS or any(spec.options.queue_id is not None for spec in specs):
        return False
    return allowed


def copy_usable(connection: Connection | AsyncConnection) -> bool:
    """Whether ``connection`` itself can take the COPY road (checked again on the
    connection a session hands out: its options may differ from its engine's)."""
    return _psycopg_allowed(connection.dialect, options_of(connection))


class CopyRows:
    """A batch of plain jobs, validated and serialized, waiting for its ids and ``now()``.

    Made without I/O by :meth:`prepare`, which checks what the statement's rows are checked
    for; :meth:`render` makes the two COPYs' data once the ids are known.
    """

    __slots__ = ("_dues", "_executions", "_heads", "_mids", "_specs", "_tails")

    def __init__(
        self,
        specs: Sequence[JobSpec],
        shapes: list[tuple[str, str, str]],
        tails: list[str],
        dues: list[str | float | None],
    ) -> None:
        self._specs = specs
        self._heads = [shape[0] for shape in shapes]
        self._mids = [shape[1] for shape in shapes]
        self._executions = [shape[2] for shape in shapes]
        self._tails = tails
        self._dues = dues

    def __len__(self) -> int:
        return len(self._specs)

    @classmethod
    def prepare(cls, specs: Sequence[JobSpec], defaults_for: DefaultsOf) -> CopyRows:
        """Check ``specs`` (plain jobs) but for their arguments, which :meth:`render`
        serializes and checks block by block.

        ``defaults_for(name)`` gives the task's defaults and checks its name, as for
        :func:`~sqla_queue.enqueue.prepare_rows`: a bad name or option raises here, before
        anything is sent; arguments that cannot be stored raise the same
        :class:`~sqla_queue.PayloadNotSerializableError` from :meth:`render`.
        """
        shapes: list[tuple[str, str, str]] = []
        tails: list[str] = []
        dues: list[str | float | None] = []
        known: dict[str, Any] = {}
        # The columns that depend on the task and the two options only, made once per
        # combination: most batches have one or a few.
        made: dict[tuple[str, int | None, int | None], tuple[str, str, str]] = {}
        plain_tail = f"\t{_NULL}\t{_NULL}\n"
        for spec in specs:
            name = spec.task
            opts = spec.options
            shape = made.get((name, opts.priority, opts.max_attempts))
            if shape is None:
                defaults = known.get(name)
                if defaults is None:
                    defaults = known[name] = defaults_for(name)
                shape = made[(name, opts.priority, opts.max_attempts)] = _shape(
                    name, defaults, opts.priority, opts.max_attempts
                )
            if opts.unique_scope is not None or opts.on_duplicate is not None:
                opts.check_combination()
            shapes.append(shape)
            about = opts.about
            tails.append(
                plain_tail if about is None else f"\t{_field(about[0])}\t{_field(about[1])}\n"
            )
            dues.append(opts.run_at.isoformat() if opts.run_at is not None else opts.delay)
        return cls(specs, shapes, tails, dues)

    def render(self, ids: Sequence[int], now: dt.datetime) -> tuple[Iterator[str], Iterator[str]]:
        """The data of the jobs COPY and of the executions COPY, in blocks: row ``i`` gets
        ``ids[i]``, and a due time from ``now`` (the transaction's) as the statement's.

        Each block is made as it is asked for, so that the server parses one block while
        the next is made: the arguments of a jobs block are serialized and checked then,
        and may raise :class:`~sqla_queue.PayloadNotSerializableError`.
        """
        clock = now.astimezone(dt.UTC)
        plain = clock.isoformat()
        dues = [plain if due is None else _due(due, clock) for due in self._dues]
        parts = [
            range(start, min(start + _BLOCK_ROWS, len(ids)))
            for start in range(0, len(ids), _BLOCK_ROWS)
        ]
        executions = self._executions
        return (
            (self._jobs_block(part, ids, dues) for part in parts),
            ("".join([f"{ids[i]}{executions[i]}{dues[i]}\n" for i in part]) for part in parts),
        )

    def _jobs_block(self, part: range, ids: Sequence[int], dues: list[str]) -> str:
        specs = self._specs[part.start : part.stop]
        payloads: list[dict[str, Any]] = []
        for spec in specs:
            check_keywords_storable(spec.task, spec.args, spec.kwargs)
            payloads.append(make_payload(spec.args, spec.kwargs, task=spec.task))
        texts = _encode_payloads(payloads, specs)
        heads, mids, tails = self._heads, self._mids, self._tails
        return "".join(
            [
                f"{ids[i]}{heads[i]}{text}{mids[i]}{dues[i]}{tails[i]}"
                for i, text in zip(part, texts, strict=True)
            ]
        )


def _due(due: str | float, clock: dt.datetime) -> str:
    """A due time as the statement computes it: ``run_at``'s text, or ``now() + delay``
    with the delay rounded to the microsecond half to even, as PostgreSQL's interval
    arithmetic rounds it (in UTC, so no time zone's transitions move it)."""
    if isinstance(due, str):
        return due
    return (clock + dt.timedelta(microseconds=round(due * 1_000_000))).isoformat()


def _shape(
    name: str, defaults: Any, priority: int | None, attempts: int | None
) -> tuple[str, str, str]:
    """The fields around a job's payload and due time, and its execution's before the due
    time, for a job of task ``name`` with these options."""
    task = _field(name)
    priority = defaults.priority if priority is None else priority
    attempts = defaults.max_attempts if attempts is None else attempts
    return f"\t{task}\t", f"\t{priority}\t{attempts}\t", f"\t{task}\t{priority}\tpending\t"


#: Put between the payloads to encode them in one call; the text of the batch is split
#: where it is found. A payload that holds it itself shows as one part too many.
_MARK = "\x01sqla_queue:next-row\x02"


def _encode_payloads(payloads: list[dict[str, Any]], specs: Sequence[JobSpec]) -> list[str]:
    """Each payload's JSON text, escaped for COPY, or :class:`PayloadNotSerializableError`
    (the checks of :func:`sqla_queue.enqueue.prepare_rows`' chunks, on the payloads alone).

    One encoder call for the batch (most of the cost of a call per payload is the call),
    with :data:`_MARK` between the payloads to split the text at.
    """
    count = len(payloads)
    marked: list[Any] = [_MARK] * (2 * count - 1)
    marked[::2] = payloads
    text = dump_payloads(
        marked,
        lambda: zip(payloads, (spec.task for spec in specs), strict=True),
        objects=2 * count,
        arrays=count + 1,
    )
    # The encoder writes ASCII with every control character escaped: of COPY's special
    # characters only the backslash can occur, and the mark's own escapes have one.
    text = text.replace("\\", "\\\\")
    separator = f",{encode_json(_MARK)},".replace("\\", "\\\\")
    texts = text[1:-1].split(separator)
    if len(texts) != count:
        texts = [encode_json(payload).replace("\\", "\\\\") for payload in payloads]
    return texts


class CopyNames(NamedTuple):
    """The two tables' names as the server resolves them, quoted for raw SQL."""

    jobs: str
    executions: str


def copy_names(tables: QueueTables, dialect: Dialect) -> CopyNames:
    """The names of ``tables`` (as a connection's ``schema_translate_map`` moved them) for
    SQL that SQLAlchemy does not compile: a COPY, a text parameter."""
    prep = dialect.identifier_preparer
    schema = tables.effective_schema
    prefix = f"{prep.quote_schema(schema)}." if schema else ""
    return CopyNames(
        prefix + prep.quote(tables.jobs.name), prefix + prep.quote(tables.executions.name)
    )


def copy_flow(
    rows: CopyRows,
    names: CopyNames,
    notify: Executable | None,
    fallback: Callable[[], Flow[list[int]]],
) -> Flow[list[int]]:
    """Write ``rows`` by COPY (see the module's docstring); their ids, in input order.

    ``notify`` wakes the workers (None: the queue does not notify). When no ids could be
    reserved (no grant on the sequence), ``fallback()``'s steps write the batch instead.
    The COPYs run inside a savepoint: arguments found unstorable while the rows stream
    leave nothing behind, and the caller's transaction usable, as a refusal before any
    I/O would.
    """
    params: ReserveParams = {"jobs": names.jobs, "count": len(rows)}
    ((reserved, now),) = yield RESERVE_IDS, params
    if reserved is None:
        return (yield from fallback())
    ids = sorted(map(int, reserved.split(",")))
    jobs, executions = rows.render(ids, now)
    yield COPY_SAVEPOINT, {}
    try:
        yield CopyIn(copy_sql(names.jobs, JOBS_COPY_COLUMNS), jobs)
    except PayloadNotSerializableError:
        yield COPY_ROLLBACK, {}
        yield COPY_RELEASE, {}
        raise
    yield CopyIn(copy_sql(names.executions, EXECUTIONS_COPY_COLUMNS), executions)
    yield COPY_RELEASE, {}
    if notify is not None:
        yield notify, {}
    return ids


def _wrapped(dialect: Dialect, step: CopyIn, exc: Exception) -> Exception:
    """The driver's error as SQLAlchemy raises a statement's (``IntegrityError``, ...)."""
    return DBAPIError.instance(step.sql, None, exc, dialect.loaded_dbapi.Error, dialect=dialect)
