"""Preparing enqueued rows without I/O: validated and serialized in the caller's process.

The rows are then written by one statement per chunk on the caller's connection (see
:mod:`sqla_queue._binds`), so a bad argument fails before anything reaches the database.
A single job takes a shorter road: :func:`encode_one` serializes its one row, and
:class:`DriverStatement` holds the enqueue statement compiled once per dialect, so that
each call sends the same text without SQLAlchemy's per-execution compile-cache work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from sqla_queue._identifiers import validate_task_name
from sqla_queue.core.payload import dump_json, encode_json, make_payload
from sqla_queue.task import EnqueueOptions, JobSpec

__all__ = [
    "CHUNK_SIZE",
    "DriverStatement",
    "TaskDefaults",
    "driver_statement_for",
    "encode_one",
    "prepare_rows",
]

#: Rows per statement in a bulk enqueue: large enough to amortize the round trip, small
#: enough that one JSON parameter stays a few megabytes.
CHUNK_SIZE = 5_000


class TaskDefaults:
    """The per-task values a job row falls back to when the call does not set them."""

    __slots__ = ("max_attempts", "priority")

    def __init__(self, priority: int, max_attempts: int) -> None:
        self.priority = priority
        self.max_attempts = max_attempts


def _row(spec: JobSpec, defaults: TaskDefaults, seq: int) -> dict[str, Any]:
    return _fields(spec.task, spec.args, spec.kwargs, spec.options, defaults, seq)


def _fields(
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    opts: EnqueueOptions,
    defaults: TaskDefaults,
    seq: int,
) -> dict[str, Any]:
    return {
        "task": task,
        "payload": make_payload(args, kwargs),
        "priority": defaults.priority if opts.priority is None else opts.priority,
        "queue_id": opts.queue_id,
        "max_attempts": defaults.max_attempts if opts.max_attempts is None else opts.max_attempts,
        "run_at": opts.run_at.isoformat() if opts.run_at else None,
        "delay": opts.delay,
        "seq": seq,
    }


def prepare_rows(
    specs: Iterable[JobSpec], defaults_for: Any, chunk_size: int = CHUNK_SIZE
) -> list[str]:
    """Validate and serialize ``specs`` into JSON chunks for the enqueue statement.

    ``defaults_for(name)`` returns the :class:`TaskDefaults` of a task, raising
    :class:`~sqla_queue.UnknownTaskError` for a name the queue does not know. Every spec is
    checked before any chunk is returned, so a bad one means nothing is written.
    """
    chunks: list[str] = []
    batch: list[dict[str, Any]] = []
    for seq, spec in enumerate(specs):
        validate_task_name(spec.task)
        batch.append(_row(spec, defaults_for(spec.task), seq))
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


def _dump_chunk(rows: list[dict[str, Any]]) -> str:
    try:
        return encode_json(rows)
    except (TypeError, ValueError):
        # Slow path, only on failure: find the row to blame by name.
        for row in rows:
            dump_json(row["payload"], task=row["task"])
        raise


class DriverStatement:
    """A statement compiled once for one dialect, to run as driver SQL.

    ``Connection.execute`` of a Core statement looks its compiled form up in SQLAlchemy's
    cache, then builds and processes the parameters, on every call. For a statement that
    runs once per business transaction, that was a third of the enqueue's client CPU. Here
    the text, the values SQLAlchemy bound itself, and the conversions its types apply are
    taken once; :meth:`params` then only fills in the caller's values, and
    ``Connection.exec_driver_sql`` sends exactly the text ``execute`` would have sent, with
    the same events (``before_cursor_execute``, echo) and the same exception wrapping.
    """

    __slots__ = ("defaults", "processors", "text")

    def __init__(self, compiled: SQLCompiler) -> None:
        #: The SQL text, in the dialect's own (named) parameter style.
        self.text: str = str(compiled)
        processors: dict[str, Any] = dict(getattr(compiled, "_bind_processors", {}))
        #: Each bind's conversion on the way in (none for the enqueue's text and numbers).
        self.processors = processors
        #: Values SQLAlchemy bound itself (the notify channel, a literal 0.0, ...).
        self.defaults: dict[str, Any] = {
            name: _processed(processors, name, value)
            for name, value in compiled.params.items()
            if not compiled.binds[name].required
        }

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The driver's parameters for one execution with the caller's ``values``."""
        params = dict(self.defaults)
        for name, value in values.items():
            params[name] = _processed(self.processors, name, value)
        return params


def _processed(processors: Mapping[str, Any], name: str, value: Any) -> Any:
    process = processors.get(name)
    return value if process is None or value is None else process(value)


def driver_statement_for(statement: ClauseElement, dialect: Dialect) -> DriverStatement | None:
    """``statement`` compiled for ``dialect``, or None where it must go through ``execute``.

    Only drivers that take parameters by name (psycopg, psycopg2) are served, and only a
    statement whose text is final once compiled (no parameter expanded at execution);
    anything else keeps SQLAlchemy's own execution.
    """
    if dialect.paramstyle not in ("pyformat", "named"):
        return None
    compiled = statement.compile(dialect=dialect)
    if not isinstance(compiled, SQLCompiler) or compiled.literal_execute_params:
        return None
    if compiled.post_compile_params:
        return None
    return DriverStatement(compiled)
