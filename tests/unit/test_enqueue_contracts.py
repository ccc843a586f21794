"""The enqueue side's contracts, each defined once and held here: no database.

- the row record (``EnqueueRow``) against the columns the SQL reads from the JSON rows;
- the parameter record (``EnqueueParams``) against the statement's bind parameters;
- the import direction: ``spec`` below ``enqueue`` below ``task`` below ``queue``;
- a task name is checked once, by the defaults lookup;
- task defaults are resolved at registration, and the worker plan carries them.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.compiler import SQLCompiler

import sqla_queue
from sqla_queue import InvalidIdentifierError, JobSpec, Queue, UnknownTaskError
from sqla_queue.enqueue import TaskDefaults, encode_one, prepare_rows
from sqla_queue.models import build_tables
from sqla_queue.registry import KnownTasks
from sqla_queue.spec import EnqueueOptions
from sqla_queue.statements.enqueue import (
    ENQUEUE_ROW_FIELDS,
    EnqueueParams,
    EnqueueRow,
    enqueue_statement,
)

pytestmark = pytest.mark.unit

DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]
PACKAGE = Path(sqla_queue.__file__).parent
SHAPES = [
    pytest.param(notify, keyed, id=f"notify={notify},keyed={keyed}")
    for notify in (True, False)
    for keyed in (True, False)
]


def compile_enqueue(*, notify: bool, keyed: bool) -> SQLCompiler:
    tables = build_tables(MetaData(), schema="app", prefix="q_")
    compiled = enqueue_statement(tables, notify=notify, keyed=keyed).compile(dialect=DIALECT)
    assert isinstance(compiled, SQLCompiler)
    return compiled


# -- the row record ----------------------------------------------------------------------


def test_the_row_record_has_exactly_the_fields_the_statement_reads() -> None:
    assert sorted(EnqueueRow.__annotations__) == sorted(ENQUEUE_ROW_FIELDS)
    # The optional ones are exactly those a plain job leaves out (unique key, linked row).
    assert EnqueueRow.__optional_keys__ == frozenset({"unique_key", "about_table", "about_key"})


@pytest.mark.parametrize(("notify", "keyed"), SHAPES)
def test_the_row_fields_are_the_record_definition_in_the_sql(notify: bool, keyed: bool) -> None:
    sql = str(compile_enqueue(notify=notify, keyed=keyed))
    found = re.search(r"jsonb_to_recordset\(.*?\) AS r\(([^)]*)\)", sql)
    assert found is not None, sql
    columns = [part.split()[0] for part in found.group(1).split(",")]
    assert sorted(columns) == sorted(EnqueueRow.__annotations__)


def test_an_encoded_row_has_the_record_keys() -> None:
    rows = json.loads(encode_one("t", [1], {"a": 2}, EnqueueOptions(), TaskDefaults(0, 1)))
    # A plain job's row carries the required keys only: the optional ones read as NULL.
    required = [k for k in EnqueueRow.__annotations__ if k in EnqueueRow.__required_keys__]
    assert [list(row) for row in rows] == [required]


def test_an_encoded_row_with_every_option_has_every_record_key() -> None:
    options = EnqueueOptions(unique_key="k", about=("orders", 7))
    rows = json.loads(encode_one("t", [1], {"a": 2}, options, TaskDefaults(0, 1)))
    assert [sorted(row) for row in rows] == [sorted(EnqueueRow.__annotations__)]
    assert (rows[0]["unique_key"], rows[0]["about_table"], rows[0]["about_key"]) == (
        "k",
        "orders",
        "7",
    )


# -- the parameter record ----------------------------------------------------------------


@pytest.mark.parametrize(("notify", "keyed"), SHAPES)
def test_the_parameter_record_is_the_statements_required_binds(notify: bool, keyed: bool) -> None:
    compiled = compile_enqueue(notify=notify, keyed=keyed)
    required = {name for name, bind in compiled.binds.items() if bind.required}
    assert required == set(EnqueueParams.__required_keys__)
    assert EnqueueParams.__optional_keys__ == frozenset()


# -- import direction --------------------------------------------------------------------


def imported_modules(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("spec", {"sqla_queue.task", "sqla_queue.queue", "sqla_queue.enqueue"}),
        ("enqueue", {"sqla_queue.task", "sqla_queue.queue"}),
        ("task", {"sqla_queue.queue"}),
    ],
)
def test_the_enqueue_side_imports_only_downwards(module: str, forbidden: set[str]) -> None:
    assert imported_modules(module) & forbidden == set()


def test_a_task_holds_the_enqueuer_not_the_queue() -> None:
    queue = Queue(metadata=MetaData())

    @queue.task(name="t")
    def t() -> None: ...

    assert not hasattr(t, "queue")
    assert t.options(priority=1).enqueuer is t.enqueuer


# -- the name is checked once ------------------------------------------------------------


def test_prepare_rows_leaves_the_name_check_to_the_lookup() -> None:
    looked_up: list[str] = []

    def anything(name: str) -> TaskDefaults:
        looked_up.append(name)
        return TaskDefaults(4, 2)

    # No pattern match of its own: a lookup that accepts the name is the whole check.
    rows = json.loads(prepare_rows([JobSpec("not a valid name")], anything)[0])
    assert looked_up == ["not a valid name"]
    assert (rows[0]["priority"], rows[0]["max_attempts"]) == (4, 2)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("known", None),
        ("declared", None),
        ("not valid", InvalidIdentifierError),
        ("", InvalidIdentifierError),
        (5, InvalidIdentifierError),
        (["a"], InvalidIdentifierError),
        ("valid_but_unknown", UnknownTaskError),
    ],
)
def test_the_lookup_raises_what_validating_then_looking_up_would(name: Any, error: Any) -> None:
    known = KnownTasks()
    known.register("known", TaskDefaults(1, 1))
    known.declare("declared", TaskDefaults(2, 2))
    if error is None:
        assert isinstance(known.lookup(name), TaskDefaults)
    else:
        with pytest.raises(error):
            known.lookup(name)


def test_a_registered_task_wins_over_a_declaration_of_its_name() -> None:
    queue = Queue(metadata=MetaData())
    queue.declare_task("t", priority=9)

    @queue.task(name="t", priority=3)
    def t() -> None: ...

    queue.declare_task("t", priority=8)
    assert queue._registry.known.lookup("t").priority == 3
    with pytest.raises(UnknownTaskError, match=r"known tasks: \['t'\]"):
        queue._registry.known.lookup("other")


# -- defaults resolved at registration, carried by the worker plan -----------------------


def test_task_defaults_are_resolved_at_registration() -> None:
    queue = Queue(metadata=MetaData(), lost_interval=20.0, max_reclaims=2, max_attempts=3)

    @queue.task(name="plain")
    def plain() -> None: ...

    @queue.task(name="own", lost_interval=4.0, max_reclaims=0, max_attempts=5)
    def own() -> None: ...

    assert (plain.task_options.lost_interval, plain.task_options.max_reclaims) == (20.0, 2)
    assert plain.task_options.max_attempts == 3
    assert (own.task_options.lost_interval, own.task_options.max_reclaims) == (4.0, 0)
    assert own.task_options.max_attempts == 5


def test_the_worker_plan_carries_each_tasks_resolved_defaults() -> None:
    queue = Queue(metadata=MetaData(), lost_interval=20.0, max_reclaims=2)

    @queue.task(name="a", concurrency_limit=3)
    def a() -> None: ...

    @queue.task(name="b", lost_interval=4.0, pass_context=True)
    async def b(ctx: Any) -> None: ...

    plan = queue.worker_plan()
    assert plan.tables is queue.tables
    assert sorted(plan.tasks) == ["a", "b"]
    assert (plan.tasks["a"].lease, plan.tasks["a"].max_reclaims) == (20.0, 2)
    assert plan.tasks["a"].handler is a.fn
    assert not plan.tasks["a"].is_async
    assert (plan.tasks["b"].lease, plan.tasks["b"].is_async, plan.tasks["b"].pass_context) == (
        4.0,
        True,
        True,
    )
    assert plan.declared_limits == {"a": 3}
    assert list(queue.worker_plan(["b"]).tasks) == ["b"]


def test_the_worker_plan_refuses_unknown_and_missing_tasks() -> None:
    queue = Queue(metadata=MetaData())
    with pytest.raises(UnknownTaskError, match="this worker has no tasks"):
        queue.worker_plan()

    @queue.task(name="a")
    def a() -> None: ...

    with pytest.raises(UnknownTaskError, match="this worker has no tasks"):
        queue.worker_plan([])
    with pytest.raises(UnknownTaskError, match=r"unknown task 'nope'.*known tasks: \['a'\]"):
        queue.worker_plan(["nope"])
