"""Backlogs in the statistics states users are in, and the plan checks of issue 11.

A production queue is analyzed by autovacuum while nearly empty; then a burst arrives,
keys are hot, other services' tasks share the table, and rows are scheduled for later.
:func:`grow` adds such a backlog with set-based SQL (no statistics are touched), and
:func:`violations` reads an ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan and names every node
whose work grows with the backlog.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, text

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.workflows import write_nodes_statement
from tests.support.plans import explain_prepared

__all__ = [
    "MIX",
    "ROW_BOUND",
    "WIDE_CHORD",
    "explain_analyze",
    "grow",
    "seed_fixtures",
    "seed_workflow",
    "violations",
]

#: How a backlog of N rows is split, as (share, task, queue_id, state, priority, due):
#: another service's task ahead, one hot key of the worker's task holding a large share
#: (its head pending, the rest waiting, as the enqueue writes them), rows scheduled for
#: tomorrow at a higher priority than the due ones, the due rows themselves, and a limited
#: task's rows.
MIX = (
    (0.40, "other", None, "pending", 0, True),
    (0.30, "noop", "hot", "waiting", 0, True),
    (0.15, "noop", None, "pending", 5, False),
    (0.10, "noop", None, "pending", 0, True),
    (0.05, "limited3", None, "pending", 0, True),
    # Durable jobs asleep until tomorrow (schema version 7): outside every claim index.
    (0.10, "noop", None, "suspended", 0, False),
)

#: The most rows any node of a hot statement may produce or filter out, per run, with a
#: batch of 10. Every shape of the backlog holds more than this from 10,000 rows on, so a
#: walk over any of them fails the check.
ROW_BOUND = 400

_SCANS_REFUSED = {"Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}


def _fill(
    connection: Connection,
    tables: QueueTables,
    count: int,
    *,
    task: str,
    queue_id: str | None,
    state: str,
    priority: int,
    due: bool,
) -> None:
    jobs = tables.jobs.fullname
    ex = tables.executions.fullname
    at = "now() - interval '1 second'" if due else "now() + interval '1 day'"
    key = "NULL" if queue_id is None else f"'{queue_id}'"
    # A suspended job sleeps (due: its sleep is over) or waits for signal "go".
    wait = "NULL" if state != "suspended" else ("'sleep'" if due else "'signal:go'")
    connection.execute(
        text(
            f"WITH j AS (INSERT INTO {jobs} (task, payload, priority, queue_id, max_attempts,"
            f" scheduled_at) SELECT '{task}', '{{\"args\": [], \"kwargs\": {{}}}}', {priority},"
            f" {key}, 3, {at} FROM generate_series(1, {count}) RETURNING id, scheduled_at)"
            f" INSERT INTO {ex} (id, task, priority, queue_id, state, execute_at, wait)"
            f" SELECT id, '{task}', {priority}, {key}, '{state}', scheduled_at, {wait} FROM j"
        )
    )


#: The children of the wide chord every state holds: the release of one of them, and the
#: decision of its callback, must not walk the others.
WIDE_CHORD = 20_000


def seed_workflow(connection: Connection, tables: QueueTables) -> tuple[int, int]:
    """A chord of :data:`WIDE_CHORD` children, a quarter of them ended, written as a
    workflow write does; ``(an open child's job id, the callback's job id)``."""
    nodes = [
        {
            "seq": i,
            "name": f"c{i}",
            "task": "noop",
            "payload": {"args": [], "kwargs": {}},
            "priority": 0,
            "queue_id": None,
            "max_attempts": 1,
            "run_at": None,
            "delay": None,
            "after": [],
            "after_jobs": [],
            "policy": "all_succeeded",
            "quorum": None,
            "on_parent_failure": "cancel",
        }
        for i in range(WIDE_CHORD)
    ]
    nodes.append(
        {**nodes[0], "seq": WIDE_CHORD, "name": "callback", "after": list(range(WIDE_CHORD))}
    )
    statement = write_nodes_statement(tables, new=True, notify=False)
    rows = connection.execute(
        statement,
        {"nodes": json.dumps(nodes), "name": "wide", "about_table": None, "about_key": None},
    ).all()
    ids = [row.job_id for row in rows]
    edges = tables.workflow_edges.fullname
    connection.execute(
        text(f"UPDATE {edges} SET outcome = 'succeeded' WHERE parent_id = ANY(:ended)"),
        {"ended": ids[: WIDE_CHORD // 4]},
    )
    return ids[WIDE_CHORD // 2], ids[-1]


def seed_fixtures(connection: Connection, tables: QueueTables) -> None:
    """The small, fixed part of every state: a hot key's head, keys, running, done rows."""
    _fill(connection, tables, 1, task="noop", queue_id="hot", state="pending", priority=0, due=True)
    for i in range(200):
        # Many small keys: a head each and two jobs waiting behind it.
        _fill(
            connection,
            tables,
            1,
            task="noop",
            queue_id=f"k{i}",
            state="pending",
            priority=0,
            due=True,
        )
        _fill(
            connection,
            tables,
            2,
            task="noop",
            queue_id=f"k{i}",
            state="waiting",
            priority=0,
            due=True,
        )
    for i in range(5):
        _fill(
            connection, tables, 1, task="noop", queue_id=f"d{i}", state="done", priority=0, due=True
        )
    # Durable jobs whose sleep is over (for the wake sweep), and jobs waiting for a signal.
    _fill(
        connection, tables, 50, task="noop", queue_id=None, state="suspended", priority=0, due=True
    )
    ex = tables.executions.fullname
    # Executions of a dead worker, for the reclaim sweep, and of a live one.
    connection.execute(
        text(
            f"UPDATE {ex} SET state = 'running', worker_id = gen_random_uuid(), attempt = 1,"
            f" alive_at = now() - interval '1 hour', lease_seconds = 30"
            f" WHERE id IN (SELECT id FROM {ex} WHERE queue_id IS NULL AND state = 'pending'"
            f" ORDER BY id LIMIT 50)"
        )
    )


def grow(connection: Connection, tables: QueueTables, count: int) -> None:
    """Add ``count`` rows in the proportions of :data:`MIX`."""
    for share, task, queue_id, state, priority, due in MIX:
        _fill(
            connection,
            tables,
            int(count * share),
            task=task,
            queue_id=queue_id,
            state=state,
            priority=priority,
            due=due,
        )


def explain_analyze(
    connection: Connection, sql: str, args: list[Any], *, generic: bool
) -> dict[str, Any]:
    """Run ``sql`` (``$n`` form) as a prepared statement and return its analyzed plan.

    With ``generic``, the plan is the generic plan a worker's connection caches; without,
    a plan made for these values. The caller runs the planner guard first and rolls back.
    """
    plan = explain_prepared(connection, sql, args, generic=generic, analyze=True)
    # The checks read actual row counts: a plan without them would pass every check.
    assert "Actual Rows" in plan["Plan"], "EXPLAIN without ANALYZE"
    return plan


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def _bitmap_of_active_rows(node: dict[str, Any], bound: int) -> bool:
    """A bitmap scan that reads only one key's pending and running rows.

    ``queue_active_ix`` holds nothing but those (never a key's waiting backlog), and a
    probe of a key's started job reads all of them by an index walk too when none has
    started. The rows each bitmap index scan finds still count against ``bound``.
    """
    if node["Node Type"] != "Bitmap Heap Scan":
        return False
    bitmaps = [n for n in _nodes(node) if n["Node Type"] == "Bitmap Index Scan"]
    return bool(bitmaps) and all(
        str(n.get("Index Name", "")).endswith("_queue_active_ix")
        and n.get("Actual Rows", 0) * n.get("Actual Loops", 1) <= bound
        for n in bitmaps
    )


def violations(plan: dict[str, Any], executions: str, bound: int = ROW_BOUND) -> list[str]:
    """Every node of ``plan`` whose work grows with the backlog, described.

    Refused: a sequential or bitmap scan of the executions table (but a bitmap scan of
    ``queue_active_ix`` within the bound, see :func:`_bitmap_of_active_rows`); any node of
    that table that returns or filters out more than ``bound`` rows in all its loops; a
    sort of more than ``bound`` rows.
    """
    found: list[str] = []
    for node in _nodes(plan["Plan"]):
        kind = node["Node Type"]
        loops = node.get("Actual Loops", 1)
        rows = node.get("Actual Rows", 0) * loops
        removed = (
            node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
        ) * loops
        where = (
            f"{kind} on {node.get('Relation Name')} ({node.get('Index Name')}, {node.get('Alias')})"
        )
        on_executions = node.get("Relation Name") == executions
        if on_executions and kind in _SCANS_REFUSED and not _bitmap_of_active_rows(node, bound):
            found.append(f"{where}: a scan that reads the backlog")
        if on_executions and (rows > bound or removed > bound):
            found.append(f"{where}: {rows} rows returned, {removed} filtered out")
        if kind == "Sort":
            sorted_rows = sum(
                c.get("Actual Rows", 0) * c.get("Actual Loops", 1) for c in node.get("Plans", ())
            )
            if sorted_rows > bound:
                found.append(f"Sort of {sorted_rows} rows ({node.get('Sort Key')})")
    return found
