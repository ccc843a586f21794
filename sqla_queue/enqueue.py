"""Enqueue without the Queue: validated, serialized rows written on the caller's connection.

Rows are prepared without I/O in the caller's process, so a bad argument fails before
anything reaches the database, then written by one statement per chunk on the caller's
connection (see :mod:`sqla_queue._binds`). A single job takes a shorter road:
:func:`encode_one` serializes its one row, and the enqueue statement is compiled once per
dialect (:mod:`sqla_queue.compiled`), so that each call sends the same text without
SQLAlchemy's per-execution compile-cache work.

:class:`Enqueuer` owns all of it for one queue: the statement of each shape, their driver
forms, and the lookup of a task's defaults (a :data:`DefaultsLookup`, the registry's, see
:class:`sqla_queue.registry.KnownTasks`). The queue makes one and hands it to each
:class:`~sqla_queue.Task`. This module imports neither of them.

A task with ``max_pending`` (a bounded task) takes another road, through
:mod:`sqla_queue.bounded`; an unbounded task's enqueue never comes near it. A large batch
of plain jobs on a psycopg connection is written by COPY (:mod:`sqla_queue.copying`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from sqlalchemy import Select
from sqlalchemy.engine import Connection, CursorResult, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue._binds import AnyBind, on_connection, options_of, scalars_each
from sqla_queue.bounded import BoundedStatements, bounded_flow, wait_of, write_flow
from sqla_queue.compiled import CompiledStatement, driver_statement_for
from sqla_queue.conversation import Flow, run_flow
from sqla_queue.copying import (
    CopyRows,
    copy_flow,
    copy_names,
    copy_usable,
    copy_wanted,
)
from sqla_queue.logic.payload import (
    check_keywords_storable,
    dump_payloads,
    make_payload,
)
from sqla_queue.models.tables import QueueTables
from sqla_queue.spec import (
    OPTION_NAMES,
    EnqueueKwargs,
    EnqueueOptions,
    JobSpec,
    check_keywords,
    make_enqueue_options,
)
from sqla_queue.statements.enqueue import (
    EnqueueParams,
    EnqueueRow,
    enqueue_statement,
    notify_statement,
)
from sqla_queue.unique import UniqueStatements, unique_enqueue_flow

__all__ = [
    "CHUNK_SIZE",
    "DefaultsLookup",
    "EnqueueStatements",
    "Enqueuer",
    "TaskDefaults",
    "by_name",
    "encode_one",
    "job_row",
    "prepare_rows",
]

#: Rows per statement in a bulk enqueue: large enough to amortize the round trip, small
#: enough that one JSON parameter stays a few megabytes.
CHUNK_SIZE = 5_000

#: Seconds between two counts of a full task by an enqueue that waits for room. Workers
#: free room without telling anyone, so it is polled; each count costs at most three index
#: walks of ``max_pending`` entries.
FULL_POLL_INTERVAL = 0.05


class TaskDefaults:
    """The per-task values an enqueue needs beside the call's: the row's defaults, and the
    task's bound (``max_pending``, None for an unbounded task)."""

    __slots__ = ("max_attempts", "max_pending", "priority")

    def __init__(self, priority: int, max_attempts: int, max_pending: int | None = None) -> None:
        self.priority = priority
        self.max_attempts = max_attempts
        self.max_pending = max_pending


#: A task name to its :class:`TaskDefaults`; raises for a name that cannot be enqueued.
DefaultsLookup = Callable[[str], TaskDefaults]


def by_name(
    task: str, kwargs: Mapping[str, Any] | None, args: Sequence[Any], options: EnqueueKwargs
) -> JobSpec:
    """The spec of ``queue.enqueue(session, task, kwargs, args=..., **options)``, its
    arguments' types and the options' names checked (the values are checked by
    ``make_enqueue_options``, the name and the arguments' JSON when the row is made)."""
    check_keywords("Queue.enqueue", options, OPTION_NAMES)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping of the task's keyword arguments, got {kwargs!r}")
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(
            f"args must be a list or tuple of the task's positional arguments, got {args!r}"
        )
    return JobSpec(task, tuple(args), dict(kwargs or {}), make_enqueue_options(**options))


def job_row(spec: JobSpec, defaults: TaskDefaults, seq: int) -> EnqueueRow:
    """The enqueue row of ``spec`` at ``seq``: its payload made and its keywords checked
    (the JSON of the payload is checked when the rows are dumped)."""
    check_keywords_storable(spec.task, spec.args, spec.kwargs)
    return _fields(spec.task, spec.args, spec.kwargs, spec.options, defaults, seq)


def _fields(
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    opts: EnqueueOptions,
    defaults: TaskDefaults,
    seq: int,
) -> EnqueueRow:
    row: EnqueueRow = {
        "task": task,
        "payload": make_payload(args, kwargs, task=task),
        "priority": defaults.priority if opts.priority is None else opts.priority,
        "queue_id": opts.queue_id,
        "max_attempts": defaults.max_attempts if opts.max_attempts is None else opts.max_attempts,
        "run_at": opts.run_at.isoformat() if opts.run_at else None,
        "delay": opts.delay,
        "seq": seq,
    }
    # Only set when used: a plain job's JSON row is exactly what it was before them.
    if opts.unique_key is not None:
        row["unique_key"] = opts.unique_key
    elif opts.unique_scope is not None or opts.on_duplicate is not None:
        opts.check_combination()
    if opts.about is not None:
        row["about_table"], row["about_key"] = opts.about
    return row


def prepare_rows(
    specs: Iterable[JobSpec], defaults_for: DefaultsLookup, chunk_size: int = CHUNK_SIZE
) -> list[str]:
    """Validate and serialize ``specs`` into JSON chunks for the enqueue statement.

    ``defaults_for(name)`` returns the :class:`TaskDefaults` of a task and is the name's
    only check: it raises :class:`~sqla_queue.InvalidIdentifierError` for an invalid name
    and :class:`~sqla_queue.UnknownTaskError` for one the queue does not know (see
    :meth:`sqla_queue.registry.KnownTasks.lookup`). Every spec is checked before any chunk
    is returned, so a bad one means nothing is written.
    """
    chunks: list[str] = []
    batch: list[EnqueueRow] = []
    for seq, spec in enumerate(specs):
        batch.append(job_row(spec, defaults_for(spec.task), seq))
        if len(batch) >= chunk_size:
            chunks.append(_dump_chunk(batch))
            batch = []
    if batch:
        chunks.append(_dump_chunk(batch))
    return chunks


def encode_one(
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: EnqueueOptions,
    defaults: TaskDefaults,
) -> str:
    """The ``rows`` parameter of a one-job enqueue: what ``prepare_rows`` makes of one spec.

    The caller has already resolved ``defaults`` for ``task`` (which also proves the name
    valid: only valid names can be registered or declared).
    """
    return _dump_chunk([_fields(task, args, kwargs, options, defaults, 0)])


def _dump_chunk(rows: list[EnqueueRow]) -> str:
    """The JSON text of ``rows``, or :class:`~sqla_queue.PayloadNotSerializableError`.

    Each row's payload must be storable as PostgreSQL ``jsonb`` (see
    :mod:`sqla_queue.logic.payload`). The encoder refuses non-JSON types and NaN itself; the
    rest (NUL, lone surrogates, non-string keys, depth) is proven absent from the encoded
    text in a few C-speed scans, discounting the rows' own structure (per row the row,
    payload and kwargs objects and the args array, plus the enclosing array), and only a
    suspect text costs a walk of the payloads (of their strings only if the text holds a
    NUL or a lone surrogate).
    """
    count = len(rows)
    return dump_payloads(
        rows,
        lambda: ((row["payload"], row["task"]) for row in rows),
        objects=3 * count,
        arrays=count + 1,
    )


class EnqueueStatements:
    """The statements of one queue's enqueues, for the connections that see ``tables``.

    The enqueue statement of each shape (for calls with a ``queue_id`` or none), its driver
    SQL per dialect, and the statements of bounded and unique enqueues. The wake-up channel
    and the bounded tasks' lock names derive from ``tables``: a tenant's (see
    :meth:`Enqueuer.statements_for`) are its own.
    """

    def __init__(self, tables: QueueTables, *, notify: bool) -> None:
        self.tables = tables
        #: The enqueue statement by shape: for calls with a ``queue_id`` (True) or none.
        self.by_shape: dict[bool, Select[int]] = {
            keyed: enqueue_statement(tables, notify=notify, keyed=keyed) for keyed in (True, False)
        }
        # The enqueue statement compiled for each dialect seen and each shape (None: not
        # served that way).
        self._driver: dict[tuple[Dialect, bool], CompiledStatement | None] = {}

    def driver_statement(self, connection: Connection, keyed: bool) -> CompiledStatement | None:
        """The enqueue statement as driver SQL for ``connection``, or None to use execute.

        A ``schema_translate_map`` execution option changes the compiled text, so such a
        connection keeps SQLAlchemy's own execution, which applies it.
        """
        if "schema_translate_map" in connection.get_execution_options():
            return None
        key = (connection.dialect, keyed)
        try:
            return self._driver[key]
        except KeyError:
            found = driver_statement_for(self.by_shape[keyed], connection.dialect)
            self._driver[key] = found
            return found

    @cached_property
    def notify(self) -> Select[Any]:
        """The ``pg_notify`` that wakes this queue's workers, for a COPY enqueue."""
        return notify_statement(self.tables)

    @cached_property
    def bounded(self) -> BoundedStatements:
        """The statements of a bounded enqueue (built on first use)."""
        return BoundedStatements.build(self.tables)

    @cached_property
    def unique(self) -> UniqueStatements:
        """The statements of a unique enqueue (built on first use)."""
        return UniqueStatements.build(self.tables)


class Enqueuer:
    """Writes jobs of one queue's tables through the caller's Session or Connection.

    It owns the :class:`EnqueueStatements` of the queue, one set per schema that a
    connection's ``schema_translate_map`` moves the tables to, and ``defaults``, the lookup
    of a task's :class:`TaskDefaults` (which also checks the name). Nothing here commits:
    every write joins the caller's transaction.
    """

    #: The queue's :class:`~sqla_queue.workflows.WorkflowWriter`, set by the registry that
    #: makes this enqueuer (this module cannot import it: workflows build on enqueues).
    workflows: Any = None

    def __init__(self, tables: QueueTables, *, notify: bool, defaults: DefaultsLookup) -> None:
        self.tables = tables
        self.notify = notify
        self.defaults = defaults
        self._plain = EnqueueStatements(tables, notify=notify)
        self._translated: dict[QueueTables, EnqueueStatements] = {}

    def statements_for(self, connection: Connection | AsyncConnection) -> EnqueueStatements:
        """The statements for ``connection``: its tenant's, when its
        ``schema_translate_map`` moves the queue's schema (a channel and lock names of the
        tenant's own), else the queue's."""
        translate = options_of(connection).get("schema_translate_map")
        tables = self.tables.translated(translate) if translate else self.tables
        if tables is self.tables:
            return self._plain
        found = self._translated.get(tables)
        if found is None:
            found = self._translated.setdefault(
                tables, EnqueueStatements(tables, notify=self.notify)
            )
        return found

    def execute(self, connection: Connection, rows: str, keyed: bool) -> CursorResult[Any]:
        """Run the statement of shape ``keyed`` for ``rows`` on ``connection``."""
        params: EnqueueParams = {"rows": rows}
        statements = self.statements_for(connection)
        driver = statements.driver_statement(connection, keyed)
        if driver is None:
            return connection.execute(statements.by_shape[keyed], params)
        return connection.exec_driver_sql(driver.text, driver.params(params))

    async def execute_async(
        self, bind: AsyncSession | AsyncConnection, rows: str, keyed: bool
    ) -> int:
        """Run the statement of shape ``keyed`` for one job's ``rows``; its id."""
        params: EnqueueParams = {"rows": rows}
        connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
        statements = self.statements_for(connection)
        sync = connection.sync_connection
        driver = None if sync is None else statements.driver_statement(sync, keyed)
        if driver is None:
            result = await connection.execute(statements.by_shape[keyed], params)
        else:
            result = await connection.exec_driver_sql(driver.text, driver.params(params))
        return int(result.scalar_one())

    def enqueue_call(
        self,
        session: AnyBind,
        task: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        options: EnqueueOptions,
    ) -> int | Coroutine[Any, Any, int]:
        """One job, as :meth:`enqueue_specs` would write it, on the single-job fast path.

        Same checks in the same order (task name, then the arguments' JSON), same row, same
        statement; only the statement's execution skips SQLAlchemy's compile-cache lookup
        where the driver allows (see :mod:`sqla_queue.compiled`). Returns the job id, or a
        coroutine of it for async sessions.
        """
        if options.unique_key is not None or options.on_duplicate is not None:
            return _first(
                self.enqueue_unique(session, [JobSpec(task, tuple(args), dict(kwargs), options)])
            )
        defaults = self.defaults(task)
        if defaults.max_pending is not None:
            spec = JobSpec(task, tuple(args), dict(kwargs), options)
            return _first(self.enqueue_bounded(session, [spec], {task: defaults.max_pending}))
        rows = encode_one(task, args, kwargs, options, defaults)
        keyed = options.queue_id is not None
        if isinstance(session, AsyncSession | AsyncConnection):
            return self.execute_async(session, rows, keyed)
        connection = session.connection() if isinstance(session, Session) else session
        return int(self.execute(connection, rows, keyed).scalar_one())

    def enqueue_spec(self, session: AnyBind, spec: JobSpec) -> int | Coroutine[Any, Any, int]:
        """Enqueue one call; the id, or a coroutine of it for async sessions."""
        check_keywords_storable(spec.task, spec.args, spec.kwargs)
        return self.enqueue_call(session, spec.task, spec.args, spec.kwargs, spec.options)

    def enqueue_specs(
        self, session: AnyBind, specs: Iterable[JobSpec]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Validate, serialize and write ``specs``, a few thousand per statement.

        All specs are checked before the first row is written, and the chunks are written
        in one transaction, even on an AUTOCOMMIT connection (see
        :func:`~sqla_queue._binds.scalars_each`): a batch is written whole or not at all.
        Returns ids in input order (or a coroutine of them for async sessions). A large
        batch of plain jobs on psycopg goes by COPY (:mod:`sqla_queue.copying`), whose
        arguments are checked as the rows stream, and undone to a savepoint if one fails.
        """
        specs = specs if isinstance(specs, Sequence) else list(specs)
        if any(spec.options.unique_key is not None for spec in specs):
            return self.enqueue_unique(session, specs)
        bounds: dict[str, int] = {}
        if copy_wanted(session, specs):
            rows = CopyRows.prepare(specs, self._noting_bounds(bounds))
            if not bounds:
                return on_connection(session, lambda c: self._write_copy(c, specs, rows))
            return self.enqueue_bounded(session, specs, bounds)
        chunks = prepare_rows(specs, self._noting_bounds(bounds))
        if bounds:
            return self.enqueue_bounded(session, specs, bounds, chunks)
        keyed = any(spec.options.queue_id is not None for spec in specs)
        params: list[EnqueueParams] = [{"rows": chunk} for chunk in chunks]

        def write(connection: Any) -> Any:
            statement = self.statements_for(connection).by_shape[keyed]
            return scalars_each(connection, statement, params)

        return on_connection(session, write)

    def _write_copy(
        self, connection: Connection | AsyncConnection, specs: Sequence[JobSpec], rows: CopyRows
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Write ``rows`` (the plain jobs of ``specs``) by COPY on ``connection``, or by the
        statement where COPY cannot apply (see :mod:`sqla_queue.copying`)."""
        statements = self.statements_for(connection)
        statement = statements.by_shape[False]

        def by_statement() -> Flow[list[int]]:
            return write_flow(statement, prepare_rows(specs, self.defaults))

        if not copy_usable(connection):
            return run_flow(connection, by_statement())
        notify = statements.notify if self.notify else None
        names = copy_names(statements.tables, connection.dialect)
        return run_flow(connection, copy_flow(rows, names, notify, by_statement))

    def _noting_bounds(self, bounds: dict[str, int]) -> DefaultsLookup:
        """:attr:`defaults`, noting in ``bounds`` the ``max_pending`` of each bounded task."""

        def lookup(name: str) -> TaskDefaults:
            found = self.defaults(name)
            if found.max_pending is not None:
                bounds[name] = found.max_pending
            return found

        return lookup

    def enqueue_bounded(
        self,
        session: AnyBind,
        specs: Sequence[JobSpec],
        bounds: Mapping[str, int],
        chunks: list[str] | None = None,
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Enqueue ``specs`` (no unique key among them), some of bounded tasks.

        ``bounds`` maps each bounded task of ``specs`` to its ``max_pending``, and
        ``chunks`` are the specs' rows if already prepared. Raises
        :class:`~sqla_queue.QueueFull` when a task has no room for its rows (after
        waiting up to the specs' ``wait_if_full``); nothing of the call is written then.
        """
        if chunks is None:
            chunks = prepare_rows(specs, self.defaults)
        written = chunks
        keyed = any(spec.options.queue_id is not None for spec in specs)
        need = Counter(spec.task for spec in specs if spec.task in bounds)

        def write(connection: Any) -> Any:
            statements = self.statements_for(connection)
            statement = statements.by_shape[keyed]
            flow = bounded_flow(
                write_flow(statement, written),
                statements=statements.bounded,
                enqueue=statement,
                bounds=bounds,
                need=need,
                wait=wait_of(specs),
            )
            return run_flow(connection, flow)

        return on_connection(session, write)

    def enqueue_unique(
        self, session: AnyBind, specs: Sequence[JobSpec]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Enqueue ``specs``, some of which take a unique key (see :mod:`sqla_queue.unique`).

        Every spec is validated before the first statement. Returns one id per spec, in
        order: the new job's, or the id of the job holding the spec's key.
        """
        keyed = any(spec.options.queue_id is not None for spec in specs)
        # Validate (names, arguments, option combinations) before any key is locked.
        bounds: dict[str, int] = {}
        prepare_rows(specs, self._noting_bounds(bounds))

        def write(connection: Any) -> Any:
            statements = self.statements_for(connection)
            return run_flow(connection, self._unique_flow(statements, specs, keyed, bounds))

        return on_connection(session, write)

    def _unique_flow(
        self,
        statements: EnqueueStatements,
        specs: Sequence[JobSpec],
        keyed: bool,
        bounds: Mapping[str, int],
    ) -> Flow[list[int]]:
        """The flow of a unique enqueue, within the bounds of the bounded tasks among it."""
        enqueue = statements.by_shape[keyed]
        if not bounds:
            return unique_enqueue_flow(
                specs,
                statements=statements.unique,
                enqueue=enqueue,
                prepare=lambda chosen: prepare_rows(chosen, self.defaults),
            )
        # A bounded task's lock comes first (it orders every enqueue of the task), then
        # its keys; the count waits until the unique flow knows which calls write a job:
        # one whose key is held writes nothing, so it needs no room.
        need: Counter[str] = Counter()

        def prepare(chosen: Sequence[JobSpec]) -> list[str]:
            need.update(spec.task for spec in chosen if spec.task in bounds)
            return prepare_rows(chosen, self.defaults)

        inner = unique_enqueue_flow(
            specs, statements=statements.unique, enqueue=enqueue, prepare=prepare
        )
        return bounded_flow(
            inner,
            statements=statements.bounded,
            enqueue=enqueue,
            bounds=bounds,
            need=need,
            wait=wait_of(specs),
        )


def _first(ids: list[int] | Coroutine[Any, Any, list[int]]) -> int | Coroutine[Any, Any, int]:
    if isinstance(ids, list):
        return ids[0]

    async def first() -> int:
        return (await ids)[0]

    return first()
