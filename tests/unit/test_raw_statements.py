"""Rendering of worker statements for psycopg's raw cursor: no database."""

from __future__ import annotations

import pytest
from sqlalchemy import ARRAY, BigInteger, bindparam, column, select, table
from sqlalchemy.dialects import postgresql

from sqla_queue.worker.raw import RawStatements, supports_raw

pytestmark = pytest.mark.unit

DIALECT = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
jobs = table("jobs", column("id"), column("n"))


def limited_select() -> object:
    return (
        select(jobs.c.id, (jobs.c.n % 7).label("m"))
        .where(jobs.c.id > bindparam("after"), jobs.c.n < bindparam("after"))
        .limit(bindparam("batch", literal_execute=True))
    )


def test_placeholders_are_numbered_once_and_values_follow_in_order() -> None:
    rendered = RawStatements(DIALECT).render(limited_select(), {"after": 5, "batch": 3})
    assert "jobs.n % $1::INTEGER" in rendered.sql
    assert "jobs.id > $2 AND jobs.n < $2" in rendered.sql
    assert rendered.args == [7, 5]
    assert rendered.sql.rstrip().endswith("LIMIT 3")
    # psycopg's %% escape is undone: the raw cursor sends the text as it is.
    assert "jobs.n % " in rendered.sql and "%%" not in rendered.sql


def test_each_literal_value_gets_its_own_template_and_the_statement_compiles_once() -> None:
    raw = RawStatements(DIALECT)
    stmt = limited_select()
    a = raw.render(stmt, {"after": 1, "batch": 3})
    b = raw.render(stmt, {"after": 2, "batch": 4})
    c = raw.render(stmt, {"after": 3, "batch": 3})
    assert a.sql == c.sql != b.sql
    assert len(raw._compiled) == 1


def test_only_whole_numbers_are_rendered_into_the_text() -> None:
    raw = RawStatements(DIALECT)
    for bad in ("3; DROP TABLE jobs", 2.5, True):
        with pytest.raises(TypeError, match="batch must be an int"):
            raw.render(limited_select(), {"after": 1, "batch": bad})


def test_missing_parameter_is_named() -> None:
    with pytest.raises(KeyError, match="after"):
        RawStatements(DIALECT).render(limited_select(), {"batch": 3})


def test_values_sqlalchemy_binds_itself_are_included() -> None:
    stmt = select(jobs.c.id).where(jobs.c.n == 42)
    rendered = RawStatements(DIALECT).render(stmt, {})
    assert rendered.args == [42]


def test_type_conversions_on_the_way_in_are_applied() -> None:
    stmt = select(jobs.c.id).where(jobs.c.id == bindparam("ids", type_=ARRAY(BigInteger)))
    rendered = RawStatements(DIALECT).render(stmt, {"ids": (1, 2)})
    # ARRAY's own processing turns the tuple into a list, as Connection.execute would.
    assert rendered.args == [[1, 2]]


def test_raw_path_is_used_only_with_psycopg() -> None:
    assert supports_raw(DIALECT)
    assert not supports_raw(postgresql.asyncpg.dialect())  # type: ignore[no-untyped-call]
    assert not supports_raw(postgresql.psycopg2.dialect())  # type: ignore[no-untyped-call]


def test_docstring_example_holds() -> None:
    import doctest

    from sqla_queue.worker import raw

    assert doctest.testmod(raw).failed == 0


def test_only_an_atomic_unit_of_several_statements_is_sent_together() -> None:
    raw = RawStatements(DIALECT)
    raw.pipeline_supported = True
    one = raw.render_steps([(select(column("a")), {})], atomic=True)
    two = raw.render_steps([(select(column("a")), {}), (select(column("b")), {})], atomic=False)
    assert raw.sends_together(one, atomic=True)  # BEGIN, the statement, COMMIT
    assert not raw.sends_together(two, atomic=False)
    assert not raw.sends_together(two[:1], atomic=False)
    raw.pipeline_supported = False  # a libpq older than 14
    assert not raw.sends_together(one, atomic=True)
