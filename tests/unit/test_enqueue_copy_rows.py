"""The COPY road's statements and data, without a database (see sqla_queue.copying)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase

from sqla_queue import JobSpec, PayloadNotSerializableError, Queue
from sqla_queue.copying import _MARK, CopyRows, copy_names
from sqla_queue.enqueue import TaskDefaults
from sqla_queue.statements.enqueue import (
    EXECUTIONS_COPY_COLUMNS,
    JOBS_COPY_COLUMNS,
    RESERVE_IDS,
    copy_sql,
    notify_statement,
)

DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


class Base(DeclarativeBase):
    metadata = MetaData(schema="placeholder")


queue = Queue(Base, prefix="cq_")


@queue.task(name="t")
def t(*args: object, **kwargs: object) -> None:
    return None


def _defaults(name: str) -> TaskDefaults:
    if name != "t":
        raise LookupError(name)
    return TaskDefaults(priority=4, max_attempts=2)


def test_the_statements() -> None:
    # SQLAlchemy 2.0 renders the bound parameters without the casts that 2.1 adds.
    reserve = re.sub(r"::(VARCHAR|INTEGER)\b", "", str(RESERVE_IDS.compile(dialect=DIALECT)))
    assert "pg_get_serial_sequence(%(jobs)s, 'id')::regclass" in reserve
    assert "string_agg(nextval(s.seq)::text, ',')" in reserve
    assert "has_sequence_privilege(s.seq, 'USAGE')" in reserve
    assert "generate_series(1, %(count)s)" in reserve
    assert copy_sql('"a b"."x"', JOBS_COPY_COLUMNS) == (
        'COPY "a b"."x" (id, task, payload, priority, max_attempts, scheduled_at, '
        "about_table, about_key) FROM STDIN"
    )
    assert EXECUTIONS_COPY_COLUMNS == ("id", "task", "priority", "state", "execute_at")
    notify = notify_statement(queue.tables.translated({"placeholder": "tenant"}))
    assert notify.compile(dialect=DIALECT).params["param_1"] == "tenant.cq_wakeup"


def test_names_follow_the_translated_schema_quoted() -> None:
    assert copy_names(queue.tables, DIALECT) == (
        "placeholder.cq_jobs",
        "placeholder.cq_job_executions",
    )
    moved = queue.tables.translated({"placeholder": "Tenant One"})
    assert copy_names(moved, DIALECT).jobs == '"Tenant One".cq_jobs'


def test_rows_are_escaped_and_due_as_the_database_computes() -> None:
    now = dt.datetime(2026, 3, 8, 1, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    specs = [
        t.call("a\\b", "tab\there", "\n"),
        t.options(priority=-1, max_attempts=9, delay=0.0000015).call(),
        t.options(run_at=at, about=("orders", "k\t\\1")).call(x=_MARK),
    ]
    rows = CopyRows.prepare(specs, _defaults)
    jobs, executions = rows.render([10, 11, 12], now)
    lines = "".join(jobs).split("\n")
    assert lines[0] == (
        '10\tt\t{"args":["a\\\\\\\\b","tab\\\\there","\\\\n"],"kwargs":{}}\t4\t2\t'
        "2026-03-08T06:59:59+00:00\t\\N\t\\N"
    )
    # 1.5 microseconds rounds half to even, to 2, as PostgreSQL's interval does.
    assert lines[1].endswith("\t-1\t9\t2026-03-08T06:59:59.000002+00:00\t\\N\t\\N")
    # A payload holding the batch's separator is encoded on its own.
    assert lines[2] == (
        '12\tt\t{"args":[],"kwargs":{"x":"\\\\u0001sqla_queue:next-row\\\\u0002"}}\t4\t2\t'
        "2030-01-01T00:00:00+00:00\torders\tk\\t\\\\1"
    )
    assert "".join(executions).split("\n")[:2] == [
        "10\tt\t4\tpending\t2026-03-08T06:59:59+00:00",
        "11\tt\t-1\tpending\t2026-03-08T06:59:59.000002+00:00",
    ]


def test_a_bad_name_fails_at_once_bad_arguments_when_their_block_is_made() -> None:
    with pytest.raises(LookupError):
        CopyRows.prepare([t.call(), JobSpec("nope", (), {}, t.call().options)], _defaults)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for bad, match in (("\x00", "NUL"), (object(), "JSON"), ({1: 2}, "key")):
        rows = CopyRows.prepare([t.call(), t.call(bad)], _defaults)
        jobs, executions = rows.render([1, 2], now)
        assert list(executions)  # no arguments in them: nothing to refuse
        with pytest.raises(PayloadNotSerializableError, match=match):
            list(jobs)
