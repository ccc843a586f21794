"""Conditions on the application's rows that durable jobs wait for.

``order_approved = queue.condition(Order, Order.status == "approved")`` declares one, at
import time, beside the models: it listens to every ORM flush in the process, and when a
flush changes one of the columns the condition reads on an ``Order``, it wakes the jobs
that wait on that row, in the same transaction, if the condition now holds there. No code
path that changes the row through the ORM can forget to signal.

A write outside the ORM's flush (a Core ``UPDATE``, a bulk ``session.execute(update(...))``,
another program) does not pass through the listener: call :meth:`RowCondition.wake` in its
transaction (``order_approved.wake(session, order_id)``).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Select,
    Text,
    bindparam,
    cast,
    event,
    exists,
    false,
    func,
    inspect,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue._binds import AnyBind, on_connection, tables_for
from sqla_queue.conversation import Flow, Step
from sqla_queue.durable.run import DurableRun, Heard, Satisfied, Suspension, TimedOut
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.signals import condition_wake_statement

__all__ = ["LOCKED_ROW_RECHECK", "RowCondition"]

#: Seconds after which a ``wait_until`` looks again at a row that an application
#: transaction held locked when it looked (it does not wait for that lock: the holder may
#: keep it as long as it likes). The holder's own flush still wakes the job at once.
LOCKED_ROW_RECHECK = 1.0


class RowCondition:
    """A condition on one row of a mapped class, that ``ctx.wait_until`` waits for.

    Build it with :meth:`Queue.condition <sqla_queue.Queue.condition>`. ``clause`` reads
    columns of the mapped class's own table only; the row is named by its primary key
    (a single column).
    """

    def __init__(
        self, tables: QueueTables, entity: type[Any], clause: ColumnElement[bool], name: str | None
    ) -> None:
        mapper = inspect(entity)
        table = mapper.local_table
        keys = list(mapper.primary_key)
        if len(keys) != 1:
            raise ValueError(
                f"queue.condition needs a mapped class with a one-column primary key; "
                f"{entity.__name__} has {len(keys)}"
            )
        watched = {col.key for col in _columns_of(clause, table)}
        if not watched:
            raise ValueError(
                f"the condition reads no column of {table.name}: give a clause on "
                f"{entity.__name__}'s own columns, like {entity.__name__}.status == 'done'"
            )
        self.entity = entity
        self.clause = clause
        self._tables = tables
        self._key_column = keys[0]
        self._attributes = {
            prop.key for prop in mapper.column_attrs if {c.key for c in prop.columns} & watched
        }
        self.name = name or _derived_name(table.name, clause)
        self._key_attribute = mapper.get_property_by_column(self._key_column).key
        key_type = self._key_column.type
        key = cast(bindparam("key", type_=key_type), key_type)
        held = (
            select(func.coalesce(clause, false()))
            .select_from(table)
            .where(self._key_column == key)
            .with_for_update(read=True, skip_locked=True)
            .scalar_subquery()
        )
        present = exists(
            select(literal_column("1")).select_from(table).where(self._key_column == key)
        )
        #: One row ``(key, holds, present)``: the key as the database writes it (cast
        #: through the key column's type, so that ``5`` and ``5.00``, or a UUID in upper
        #: and lower case, name the same row); whether the condition holds there, read
        #: ``FOR SHARE SKIP LOCKED`` (a writer waits for the waiter's commit, so whichever
        #: commits second sees the other's work; ``None`` when the row is missing or an
        #: application transaction holds it); and whether the row exists.
        self.probe: Select[Any] = select(
            cast(key, Text).label("key"), held.label("holds"), present.label("present")
        )
        self._wakes: dict[QueueTables, Any] = {}
        _watch(self)

    @property
    def _prefix(self) -> str:
        return f"row:{self.name}:"

    def waits_for(self, key: Any) -> str:
        """The ``wait`` value of a job that waits for this condition on row ``key``, with
        ``key`` as given (a waiting job stores it as the database writes it: see
        :meth:`waits_for_text`)."""
        return f"{self._prefix}{key}"

    def waits_for_text(self, key_text: str) -> str:
        """The ``wait`` value for the key as the database writes it (the probe's ``key``)."""
        return f"{self._prefix}{key_text}"

    def wait_flow(
        self, run: DurableRun, name: str, key: Any, *, timeout: float | None
    ) -> Flow[Satisfied | TimedOut | Suspension]:
        """The flow of ``ctx.wait_until(self, key)``, as wait ``name`` of ``run`` (after
        the run's checkpoints were read).

        The probe never waits for the row's lock: a row that an application transaction
        holds reads as "not yet", and the job suspends with a recheck
        :data:`LOCKED_ROW_RECHECK` seconds later (the holder's own flush still wakes it at
        once, if it commits after the suspension). The job suspends on the key as the
        database writes it, which is what a flush's wake compares.
        """
        probe = Step(self.probe, {"key": key})

        def found(rows: Sequence[Any]) -> Satisfied | None:
            return Satisfied(None) if rows and rows[0].holds else None

        def heard(rows: Sequence[Any]) -> Heard:
            row = rows[0]
            locked = bool(row.present) and row.holds is None
            return self.waits_for_text(row.key), LOCKED_ROW_RECHECK if locked else None

        return run.wait(
            name, self.waits_for(key), timeout=timeout, probe=probe, found=found, heard=heard
        )

    def _wake_statement(self, tables: QueueTables) -> Any:
        found = self._wakes.get(tables)
        if found is None:
            statement = condition_wake_statement(tables, self._key_column, self.clause)
            found = self._wakes.setdefault(tables, statement)
        return found

    def wake(self, session: AnyBind, key: Any) -> list[int] | Any:
        """Wake the jobs that wait on row ``key``, if the condition holds there now.

        In ``session``'s transaction: for writes the ORM's flush does not see. Returns
        the woken jobs' ids (or a coroutine of them, for the async kinds).
        """

        def use(connection: Any) -> Any:
            statement = self._wake_statement(tables_for(self._tables, connection))
            params = {"prefix": self._prefix, "keys": [key]}
            result = connection.execute(statement, params)
            if hasattr(result, "__await__"):
                return _ids_async(result)
            return [row.id for row in result]

        return on_connection(session, use)

    def _changed(self, instance: Any, new: bool) -> bool:
        if new:
            return True
        state = inspect(instance)
        return any(state.attrs[name].history.has_changes() for name in self._attributes)

    def _key_of(self, instance: Any) -> Any:
        state = inspect(instance)
        identity = state.identity
        return identity[0] if identity else state.dict.get(self._key_attribute)

    def _after_flush(self, session: Session, changed: list[Any]) -> None:
        # A row this flush inserted has no identity yet: its key attribute has the value.
        keys = [key for obj in changed if (key := self._key_of(obj)) is not None]
        if not keys:
            return
        connection = session.connection()
        statement = self._wake_statement(tables_for(self._tables, connection))
        # One statement for every changed row of the flush, however many.
        connection.execute(statement, {"prefix": self._prefix, "keys": keys})


async def _ids_async(result: Any) -> list[int]:
    return [row.id for row in await result]


def _columns_of(clause: ColumnElement[Any], table: Any) -> list[Any]:
    found = []
    for element in visitors.iterate(clause):
        if getattr(element, "table", None) is table and hasattr(element, "key"):
            found.append(element)
    return found


def _derived_name(table: str, clause: ColumnElement[Any]) -> str:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    text = str(clause.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    return f"{table}.{hashlib.sha256(text.encode()).hexdigest()[:12]}"


#: Every live condition, by the mapped class it watches.
_conditions: weakref.WeakSet[RowCondition] = weakref.WeakSet()


def _watch(condition: RowCondition) -> None:
    _conditions.add(condition)
    if not event.contains(Session, "after_flush", _after_flush):
        event.listen(Session, "after_flush", _after_flush)


def _after_flush(session: Session, flush_context: Any) -> None:
    if not _conditions:
        return
    new = {id(obj) for obj in session.new}
    touched = [*session.new, *session.dirty]
    if not touched:
        return
    for condition in list(_conditions):
        entity: type[Any] = condition.entity
        changed = [
            obj
            for obj in touched
            if isinstance(obj, entity) and condition._changed(obj, id(obj) in new)
        ]
        if changed:
            condition._after_flush(session, changed)
