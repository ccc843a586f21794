"""Query plans of statements exactly as the driver receives them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg.sql
from sqlalchemy import Connection, Engine, event

__all__ = ["captured_statements", "generic_plan", "scans"]

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


def generic_plan(connection: Connection, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The plan PostgreSQL uses for ``sql`` as a prepared statement with a generic plan.

    That is the plan a worker's connection runs once the driver has prepared the
    statement (``WorkerSettings.generic_plans``). The statement is explained, not run.
    """
    names: list[str] = []
    for name in _PLACEHOLDER.findall(sql):
        if name not in names:
            names.append(name)
    numbered = _PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", sql)
    connection.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    connection.exec_driver_sql("SET LOCAL jit = off")
    connection.exec_driver_sql("PREPARE sqla_queue_plan_probe AS " + numbered)
    types = connection.exec_driver_sql(
        "SELECT parameter_types::text[] FROM pg_prepared_statements"
        " WHERE name = 'sqla_queue_plan_probe'"
    ).scalar_one()
    # EXPLAIN EXECUTE takes no bound parameters: the values go in as quoted literals.
    driver = connection.connection.driver_connection
    arguments = ", ".join(
        f"{psycopg.sql.Literal(params[name]).as_string(driver)}::{type_}"
        for name, type_ in zip(names, types, strict=True)
    )
    explain = f"EXPLAIN (FORMAT JSON) EXECUTE sqla_queue_plan_probe({arguments})"
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
