"""Contracts between Python and SQL, checked without a database.

Each statement builder has a ``TypedDict`` of its parameters next to it; the callers build
their parameters as that type. Here every statement is compiled with the PostgreSQL
dialect, and the bound names it needs must be exactly the record's keys, with matching
Python types. Also: the mapped classes annotate every column, and the schema-version
comment reads back what it wrote.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, TypedDict, cast

import pytest
from sqlalchemy import MetaData, Table
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import ARRAY, TypeEngine

from sqla_queue.models import (
    SCHEMA_VERSION,
    Job,
    JobExecution,
    QueueTables,
    build_tables,
    parse_schema_version_comment,
    schema_version_comment,
)
from sqla_queue.statements.admin import (
    FailedJobsParams,
    PruneParams,
    RequeueParams,
    failed_jobs_statement,
    prune_statement,
    requeue_statement,
)
from sqla_queue.statements.limits import (
    DeleteLimitParams,
    LimitedTasksParams,
    SetLimitParams,
    delete_limit_statement,
    limited_tasks_statement,
    set_limit_statement,
    stored_limits_statement,
)

pytestmark = pytest.mark.unit

DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]

Builder = Callable[[QueueTables], ClauseElement]

CONTRACTS: dict[str, tuple[Builder, type[Any]]] = {
    "requeue": (requeue_statement, RequeueParams),
    "prune": (prune_statement, PruneParams),
    "failed_jobs": (failed_jobs_statement, FailedJobsParams),
    "set_limit": (set_limit_statement, SetLimitParams),
    "delete_limit": (delete_limit_statement, DeleteLimitParams),
    "limited_tasks": (limited_tasks_statement, LimitedTasksParams),
}


@pytest.fixture(params=[(None, "sqla_queue_"), ("app", "q_")], ids=["default", "schema"])
def tables(request: pytest.FixtureRequest) -> QueueTables:
    schema, prefix = request.param
    return build_tables(MetaData(), schema=schema, prefix=prefix)


def required_binds(statement: ClauseElement) -> dict[str, TypeEngine[Any]]:
    """The parameters the compiled statement needs from its caller, with their types.

    Binds that carry their own value (an array index, a literal) are not the caller's.
    """
    compiled = cast(SQLCompiler, statement.compile(dialect=DIALECT))
    return {name: bind.type for name, bind in compiled.binds.items() if bind.required}


def _python_type(sql_type: TypeEngine[Any]) -> object:
    if isinstance(sql_type, ARRAY):
        return list[_python_type(sql_type.item_type)]  # type: ignore[misc]
    return sql_type.python_type


def contract_problems(statement: ClauseElement, params: type[Any]) -> list[str]:
    """How the statement's required parameters differ from the record; empty if they agree."""
    binds = required_binds(statement)
    hints = typing.get_type_hints(params)
    problems = [
        f"bound in the SQL, not in {params.__name__}: {name}" for name in binds.keys() - hints
    ]
    problems += [
        f"in {params.__name__}, not bound in the SQL: {name}" for name in hints.keys() - binds
    ]
    problems += [
        f"{name}: optional in {params.__name__}, required by the SQL"
        for name in sorted(params.__optional_keys__ & binds.keys())
    ]
    for name in sorted(binds.keys() & hints.keys()):
        expected = _python_type(binds[name])
        if hints[name] != expected:
            problems.append(f"{name}: {params.__name__} says {hints[name]}, the SQL {expected}")
    return problems


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_statement_parameters_match_their_record(tables: QueueTables, name: str) -> None:
    builder, params = CONTRACTS[name]
    statement = builder(tables)
    assert required_binds(statement), f"{name} binds nothing: the check would be empty"
    assert contract_problems(statement, params) == []
    assert set(required_binds(statement)) == set(params.__required_keys__)


def test_stored_limits_statement_takes_no_parameters(tables: QueueTables) -> None:
    assert required_binds(stored_limits_statement(tables)) == {}


class _WrongName(TypedDict):
    limit: int
    offset: int


class _WrongType(TypedDict):
    older_than: int
    include_failed: bool


class _Optional(TypedDict, total=False):
    task: str


@pytest.mark.parametrize(
    ("builder", "params", "needle"),
    [
        (failed_jobs_statement, _WrongName, "not bound in the SQL: offset"),
        (requeue_statement, _WrongName, "bound in the SQL, not in _WrongName: ids"),
        (prune_statement, _WrongType, "older_than: _WrongType says"),
        (delete_limit_statement, _Optional, "task: optional in _Optional"),
    ],
)
def test_the_check_catches_a_record_that_disagrees(
    tables: QueueTables, builder: Builder, params: type[Any], needle: str
) -> None:
    problems = contract_problems(builder(tables), params)
    assert any(needle in problem for problem in problems), problems


#: Annotated attributes of the mapped classes that are relationships, not columns.
RELATIONSHIPS = {"execution"}


def _annotations(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _allows_none(annotation: Any) -> bool:
    if annotation is Any:
        return True
    return isinstance(annotation, types.UnionType) and type(None) in typing.get_args(annotation)


@pytest.mark.parametrize(
    ("cls", "table_of"),
    [(Job, lambda t: t.jobs), (JobExecution, lambda t: t.executions)],
    ids=["Job", "JobExecution"],
)
def test_mapped_classes_annotate_every_column(
    tables: QueueTables, cls: type, table_of: Callable[[QueueTables], Table]
) -> None:
    table = table_of(tables)
    # Relationships (Job.execution) are annotated too; every column must be.
    hints = {k: v for k, v in _annotations(cls).items() if k not in RELATIONSHIPS}
    assert set(hints) == set(table.columns.keys())
    for column in table.columns:
        annotation = hints[column.key]
        assert _allows_none(annotation) == bool(column.nullable) or annotation is Any, column.key


@pytest.mark.parametrize("version", [1, 2, SCHEMA_VERSION, 12])
def test_version_comment_reads_back_what_it_writes(version: int) -> None:
    comment = schema_version_comment(version)
    assert parse_schema_version_comment(comment) == version
    assert parse_schema_version_comment(comment, anywhere=True) == version


def test_version_comment_exact_and_anywhere() -> None:
    longer = f"notes; {schema_version_comment(2)} (hand-edited)"
    assert parse_schema_version_comment(longer) is None
    assert parse_schema_version_comment(longer, anywhere=True) == 2
    for nothing in (None, "", "mine", "sqla_queue schema version x"):
        assert parse_schema_version_comment(nothing) is None
        assert parse_schema_version_comment(nothing, anywhere=True) is None
