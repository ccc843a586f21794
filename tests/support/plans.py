"""Query plans of statements exactly as the driver receives them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg.sql
from sqlalchemy import Connection, Engine, event

__all__ = [
    "captured_statements",
    "explain_prepared",
    "generic_plan",
    "rendered_statements",
    "scans",
]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@contextmanager
def captured_statements(engine: Engine) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Record every (SQL text, parameters) pair the engine's connections send, in order.

    The text is what psycopg receives: literal-execute parameters are already rendered.
    """
    seen: list[tuple[str, dict[str, Any]]] = []

    def capture(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if isinstance(parameters, dict):
            seen.append((statement, dict(parameters)))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", capture)


@contextmanager
def rendered_statements() -> Iterator[list[tuple[str, list[Any]]]]:
    """Record every statement a worker renders for its raw cursor: ($n SQL, values)."""
    from sqla_queue.worker.raw import RawStatements

    seen: list[tuple[str, list[Any]]] = []
    original = RawStatements.render

    def render(self: RawStatements, statement: Any, params: Any) -> Any:
        rendered = original(self, statement, params)
        seen.append((rendered.sql, list(rendered.args)))
        return rendered

    RawStatements.render = render  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        RawStatements.render = original  # type: ignore[method-assign]


def generic_plan(
    connection: Connection, sql: str, params: dict[str, Any] | list[Any]
) -> dict[str, Any]:
    """The plan PostgreSQL uses for ``sql`` as a prepared statement with a generic plan.

    That is the plan a worker's connection runs once the driver has prepared the
    statement (``WorkerSettings.generic_plans``). ``sql`` is either psycopg's
    ``%(name)s`` form with a dict of values, or PostgreSQL's ``$n`` form (what the worker
    sends with ``raw_statements``) with a list. The statement is explained, not run.
    """
    connection.exec_driver_sql("SET LOCAL jit = off")
    return explain_prepared(connection, sql, params, generic=True)


def explain_prepared(
    connection: Connection,
    sql: str,
    params: dict[str, Any] | list[Any],
    *,
    generic: bool,
    analyze: bool = False,
) -> dict[str, Any]:
    """EXPLAIN of ``sql`` run as a prepared statement, as JSON; ``sql`` as in generic_plan.

    ``generic``: the generic plan a prepared statement caches, else a plan made for these
    values. ``analyze``: run it too (the caller rolls back). Settings are ``SET LOCAL``.
    """
    if isinstance(params, dict):
        names: list[str] = []
        for name in _PLACEHOLDER.findall(sql):
            if name not in names:
                names.append(name)
        numbered = _PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", sql)
        values = [params[name] for name in names]
    else:
        # exec_driver_sql goes through psycopg's %-parsing: escape the modulo operator.
        numbered = sql.replace("%", "%%")
        values = list(params)
    mode = "force_generic_plan" if generic else "force_custom_plan"
    connection.exec_driver_sql(f"SET LOCAL plan_cache_mode = {mode}")
    connection.exec_driver_sql("PREPARE sqla_queue_plan_probe AS " + numbered)
    types = connection.exec_driver_sql(
        "SELECT parameter_types::text[] FROM pg_prepared_statements"
        " WHERE name = 'sqla_queue_plan_probe'"
    ).scalar_one()
    # EXPLAIN EXECUTE takes no bound parameters: the values go in as quoted literals.
    driver = connection.connection.driver_connection
    arguments = ", ".join(
        f"{psycopg.sql.Literal(value).as_string(driver)}::{type_}"
        for value, type_ in zip(values, types, strict=True)
    ).replace("%", "%%")
    call = f"({arguments})" if arguments else ""
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    explain = f"EXPLAIN ({options}) EXECUTE sqla_queue_plan_probe{call}"
    plan: dict[str, Any] = connection.exec_driver_sql(explain).scalar_one()[0]
    connection.exec_driver_sql("DEALLOCATE sqla_queue_plan_probe")
    return plan


def scans(plan: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """Every scan node of a JSON plan: (node type, relation, index)."""
    found: list[tuple[str, str, str | None]] = []

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            found.append((node["Node Type"], node["Relation Name"], node.get("Index Name")))
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan["Plan"])
    return found


def dumps(plan: dict[str, Any]) -> str:
    """A plan as indented JSON, for assertion messages."""
    return json.dumps(plan, indent=1)
