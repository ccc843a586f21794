"""The executions table's storage parameter, on whichever SQLAlchemy the cell installed.

2.1 renders it inside ``CREATE TABLE``; 2.0 runs an ``ALTER TABLE`` right after it. Either
way ``metadata.create_all`` sends ``fillfactor = 70`` for that table and for no other. The
migration tests compare the resulting catalog with the frozen migrations on both.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, create_mock_engine
from sqlalchemy.dialects import postgresql

from sqla_queue.models import build_tables
from sqla_queue.models._storage import TABLE_WITH_KEYWORD, set_storage_parameters

pytestmark = pytest.mark.unit

DIALECT = postgresql.psycopg.dialect()


def _create_all_ddl(metadata: MetaData) -> list[str]:
    """Every statement ``metadata.create_all`` sends, compiled for PostgreSQL."""
    sent: list[str] = []

    def executor(sql: Any, *_: Any, **__: Any) -> None:
        sent.append(" ".join(str(sql.compile(dialect=DIALECT)).split()))

    engine = create_mock_engine("postgresql+psycopg://", executor)
    metadata.create_all(engine, checkfirst=False)
    return sent


def test_create_all_gives_the_executions_table_its_fillfactor_and_no_other() -> None:
    metadata = MetaData()
    tables = build_tables(metadata, schema="app", prefix="q_")
    statements = _create_all_ddl(metadata)
    mentioning = [sql for sql in statements if "fillfactor" in sql]
    assert len(mentioning) == 1
    (sql,) = mentioning
    executions = f"app.{tables.executions.name}"
    if TABLE_WITH_KEYWORD:
        assert sql.startswith(f"CREATE TABLE {executions} (")
        assert sql.endswith("WITH (fillfactor = 70)")
    else:
        assert sql == f"ALTER TABLE {executions} SET (fillfactor = 70)"
        create = statements.index(
            next(s for s in statements if s.startswith(f"CREATE TABLE {executions} "))
        )
        assert statements.index(sql) > create


def test_a_copy_of_the_table_keeps_the_parameter() -> None:
    """``Table.to_metadata`` (as a host may use) carries the option or the event along."""
    source = MetaData()
    tables = build_tables(source)
    copy = MetaData()
    tables.executions.to_metadata(copy)
    assert [sql for sql in _create_all_ddl(copy) if "fillfactor = 70" in sql]


@pytest.mark.parametrize(
    "parameters",
    [{"fillfactor": "70; DROP TABLE x"}, {"Fill Factor": "70"}, {"fillfactor": "'70'"}],
)
def test_only_plain_names_and_values_are_accepted(parameters: dict[str, str]) -> None:
    table = Table("t", MetaData(), Column("id", Integer, primary_key=True))
    with pytest.raises(ValueError, match="not a plain storage parameter"):
        set_storage_parameters(table, parameters)
