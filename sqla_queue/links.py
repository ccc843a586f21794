"""Jobs linked to the application's rows: ``task.options(about=order)``.

A job may name the row it is about, stored on the job as two texts: the row's table (its
full name, ``schema.table`` or ``table``) and its primary key (the value as text, or a
JSON array for a composite key). There is no foreign key on purpose: a job keeps its
record when the row is deleted, and linking costs the enqueue two short columns and the
claim nothing (the link lives on ``jobs``, which the claim never walks).

The app then asks with its own ORM which jobs a row has: :func:`about_condition` is the
``WHERE`` clause, and :func:`about_relationship` a read-only ``relationship()`` from the
app's mapped class to the queue's ``Job``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, Text, and_, cast, inspect, literal, select
from sqlalchemy.exc import NoInspectionAvailable
from sqlalchemy.orm import Mapper, Relationship, foreign, relationship, remote

from sqla_queue.logic.payload import text_problem

__all__ = [
    "MAX_ABOUT_BYTES",
    "MAX_ABOUT_TEXT",
    "AboutRef",
    "about_condition",
    "about_reference",
    "about_relationship",
    "jobs_about",
    "table_name_of",
]

#: (table, key): what ``jobs.about_table`` and ``jobs.about_key`` hold for one row.
AboutRef = tuple[str, str]

#: The longest stored reference text (table or key), in characters.
MAX_ABOUT_TEXT = 512
#: The most UTF-8 bytes the table and the key may take together: they are one entry of the
#: ``about_ix`` btree index, which PostgreSQL caps at 2,704 bytes with its headers
#: (512 characters each could reach 4,096).
MAX_ABOUT_BYTES = 2_600


def _key_text(values: tuple[Any, ...]) -> str:
    if len(values) == 1:
        return str(values[0])
    return json.dumps([v if isinstance(v, int | float | str) else str(v) for v in values])


def table_name_of(target: object) -> str:
    """The table name a link records for ``target``: a mapped class, a ``Table`` or a name.

    A mapped class links through its base mapper's table, so rows of every subclass of a
    joined-inheritance hierarchy share one name.
    """
    if isinstance(target, str):
        if not target:
            raise ValueError("about: the table name must not be empty")
        return target
    if isinstance(target, Table):
        return target.fullname
    try:
        mapper = inspect(target)
    except NoInspectionAvailable:
        raise TypeError(
            f"about: expected a mapped class, a Table or a table name, got {target!r}"
        ) from None
    if not isinstance(mapper, Mapper):
        raise TypeError(f"about: expected a mapped class, a Table or a table name, got {target!r}")
    table = mapper.base_mapper.local_table
    if not isinstance(table, Table):
        raise TypeError(f"about: {target!r} is not mapped to a table")
    return table.fullname


def about_reference(about: object) -> AboutRef:
    """The stored ``(table, key)`` of ``about``, the value of ``task.options(about=...)``.

    ``about`` is a persistent mapped instance (``about=order``), or a pair of a mapped class
    (or ``Table``, or table name) and its primary key value (a tuple for a composite key):
    ``about=(Order, 42)``. An instance that has no identity yet (not flushed) raises
    ``ValueError``: flush the session first, so the row has its primary key.
    """
    if isinstance(about, tuple):
        if len(about) != 2:
            raise TypeError(
                "about: a pair (mapped class or table, primary key) was expected, "
                f"got a tuple of {len(about)}"
            )
        target, key = about
        values = key if isinstance(key, tuple) else (key,)
        if not values or any(v is None for v in values):
            raise ValueError(f"about: the primary key must not be empty or None, got {key!r}")
        return _checked(table_name_of(target), _key_text(values))
    try:
        state = inspect(about)
    except NoInspectionAvailable:
        raise TypeError(
            "about: expected a mapped instance or a (mapped class, primary key) pair, "
            f"got {about!r} ({type(about).__name__})"
        ) from None
    mapper = getattr(state, "mapper", None)
    if mapper is None or isinstance(state, Mapper):
        raise TypeError(
            "about: expected a mapped instance or a (mapped class, primary key) pair, got "
            f"the class {about!r}; pass (cls, key)"
        )
    identity = state.identity
    if identity is None:
        raise ValueError(
            f"about: {about!r} has no primary key yet; flush the session (session.flush()) "
            "before enqueueing a job about it"
        )
    return _checked(table_name_of(mapper.class_), _key_text(tuple(identity)))


def _checked(table: str, key: str) -> AboutRef:
    for what, text in (("table name", table), ("primary key", key)):
        if len(text) > MAX_ABOUT_TEXT:
            raise ValueError(
                f"about: the {what} is {len(text)} characters; at most {MAX_ABOUT_TEXT} "
                "can be stored (it is indexed)"
            )
        problem = text_problem(text)
        if problem is not None:
            raise ValueError(f"about: the {what} {text[:60]!r} {problem}")
    # Measured after text_problem: a lone surrogate, which UTF-8 cannot encode, is refused.
    size = len(table.encode()) + len(key.encode())
    if size > MAX_ABOUT_BYTES:
        raise ValueError(
            f"about: the table name and the primary key take {size} bytes of UTF-8 "
            f"together; at most {MAX_ABOUT_BYTES} can be stored (they are indexed together)"
        )
    return table, key


def about_condition(job: Any, about: object) -> ColumnElement[bool]:
    """The ``WHERE`` clause "this job is about ``about``" over the mapped ``Job`` class.

    ``about`` is what ``task.options(about=...)`` takes (an instance, or a (class, key)
    pair), or a mapped class (or Table, or name) alone for every job about any of its rows.
    """
    if isinstance(about, str | Table) or (isinstance(about, type) and _is_mapped_class(about)):
        return job.about_table == table_name_of(about)  # type: ignore[no-any-return]
    table, key = about_reference(about)
    return and_(job.about_table == table, job.about_key == key)


def jobs_about(job: Any, about: object) -> Select[Any]:
    """``select(job)`` of the jobs about ``about`` (see :func:`about_condition`): add
    filters and order as with any select (``Queue.jobs_about``)."""
    return select(job).where(about_condition(job, about))


def _is_mapped_class(cls: type) -> bool:
    try:
        return isinstance(inspect(cls), Mapper)
    except NoInspectionAvailable:
        return False


def about_relationship(
    job: Callable[[], Any] | Any, mapped: type, **kwargs: Any
) -> Relationship[Any]:
    """A read-only one-to-many ``relationship()`` from ``mapped`` to the queue's ``Job``.

    ``Order.jobs = queue.about_relationship(Order)`` after the class is declared, then
    ``order.jobs`` lists every job linked to that order, and ``select(Order).join(Order.jobs)``
    works as any relationship. ``mapped`` must have a single-column primary key. The join
    compares the stored text with the key cast to text, so it is served by the jobs'
    ``about_ix`` index. Extra keywords go to ``relationship()`` (``order_by=``,
    ``lazy=``); ``viewonly=True`` is fixed: the queue writes these columns, not the ORM.
    """
    mapper: Any = inspect(mapped)
    if not isinstance(mapper, Mapper):
        raise TypeError(f"about_relationship: {mapped!r} is not a mapped class")
    keys = mapper.base_mapper.primary_key
    if len(keys) != 1:
        raise ValueError(
            f"about_relationship: {mapped.__name__} has a composite primary key; use "
            "queue.jobs_about() to select its jobs instead"
        )
    table = table_name_of(mapped)
    pk = keys[0]
    job_class = job

    def join() -> ColumnElement[bool]:
        cls = job_class() if callable(job_class) and not isinstance(job_class, type) else job_class
        return and_(
            remote(cls.about_table) == literal(table, Text),
            foreign(remote(cls.about_key)) == cast(pk, Text),
        )

    def target() -> Any:
        return job_class() if callable(job_class) and not isinstance(job_class, type) else job_class

    kwargs.setdefault("lazy", "select")
    return relationship(target, primaryjoin=join, viewonly=True, **kwargs)
