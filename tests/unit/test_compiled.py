"""The one compile-once statement cache (sqla_queue.compiled): no database."""

from __future__ import annotations

import doctest

import pytest
from sqlalchemy import ARRAY, BigInteger, bindparam, column, select, table
from sqlalchemy.dialects import postgresql

from sqla_queue import compiled
from sqla_queue.compiled import StatementCache, compile_statement, driver_statement_for

pytestmark = pytest.mark.unit

PSYCOPG = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
jobs = table("jobs", column("id"), column("n"))


def test_docstring_example_holds() -> None:
    assert doctest.testmod(compiled).failed == 0


def test_a_statement_compiles_once_per_cache_whatever_its_literal_values() -> None:
    cache = StatementCache(PSYCOPG)
    stmt = select(jobs.c.id).limit(bindparam("n", literal_execute=True))
    first = cache.get(stmt)
    assert cache.get(stmt) is first and len(cache) == 1
    assert first.template({"n": 3}).sql != first.template({"n": 4}).sql
    assert len(first.templates) == 2


def test_driver_params_carry_the_values_sqlalchemy_bound_and_convert_the_callers() -> None:
    stmt = select(jobs.c.id).where(
        jobs.c.n == 42, jobs.c.id == bindparam("ids", type_=ARRAY(BigInteger))
    )
    found = driver_statement_for(stmt, PSYCOPG)
    assert found is not None
    params = found.params({"ids": (1, 2)})
    assert params["ids"] == [1, 2]  # ARRAY's own processing, as execute applies it
    assert 42 in params.values()


def test_only_final_texts_on_named_drivers_take_the_driver_road() -> None:
    limited = select(jobs.c.id).limit(bindparam("n", literal_execute=True))
    assert driver_statement_for(limited, PSYCOPG) is None
    plain = select(jobs.c.id).where(jobs.c.id == bindparam("id"))
    assert driver_statement_for(plain, postgresql.asyncpg.dialect()) is None  # type: ignore[no-untyped-call]
    assert driver_statement_for(plain, PSYCOPG) is not None


def test_both_forms_come_from_the_same_compiled_text() -> None:
    stmt = select(jobs.c.id).where(jobs.c.id > bindparam("after"))
    one = compile_statement(stmt, PSYCOPG)
    driver = driver_statement_for(stmt, PSYCOPG)
    assert driver is not None and driver.text == one.text
    assert one.template({}).sql == one.text.replace("%(after)s", "$1")
