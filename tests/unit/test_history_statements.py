"""Compiled SQL of the partitioned history's statements: PostgreSQL dialect, no database.

The maintenance and pruning flows (:mod:`sqla_queue.history.partitions`) run these, and
``create_all`` runs the layout's DDL; any change to their text shows up here as a diff of
``snapshots/history_statements.sql``. Regenerate with SQLA_QUEUE_UPDATE_SNAPSHOTS=1 after
checking the change is intended.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import TextClause

from sqla_queue.history.layout import history_names
from sqla_queue.models.partitioning import HistoryNames, structure_statements
from sqla_queue.models.tables import QueueTables, build_tables
from sqla_queue.statements import history

pytestmark = pytest.mark.unit

SNAPSHOT = Path(__file__).parent / "snapshots" / "history_statements.sql"
DIALECT = postgresql.psycopg.dialect()  # the driver sqla_queue runs on
PARTITION = "q_jobs_done_p2026120300"
LOWER = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
UPPER = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)

Builder = Callable[[QueueTables, HistoryNames], TextClause]

BUILDERS: dict[str, Builder] = {
    "partitions_catalog": lambda t, n: history.partitions_catalog_statement(),
    "history_lock_wait": lambda t, n: history.history_lock_statement(wait=True),
    "history_lock_try": lambda t, n: history.history_lock_statement(wait=False),
    "lock_timeout": lambda t, n: history.lock_timeout_statement(5.0),
    "now": lambda t, n: history.now_statement(),
    "oldest_finished": lambda t, n: history.oldest_finished_statement(n, n.done),
    "lock_default": lambda t, n: history.lock_default_statement(n, n.failed),
    "create_partition": lambda t, n: history.create_partition_statement(n, PARTITION),
    "move_rows": lambda t, n: history.move_rows_statement(n, n.done, PARTITION, t),
    "attach_partition": lambda t, n: history.attach_partition_statement(
        n, n.done, PARTITION, LOWER, UPPER
    ),
    "prune_cutoff": lambda t, n: history.prune_cutoff_statement(),
    "count_partition": lambda t, n: history.count_partition_statement(n, PARTITION),
    "free_partition_keys": lambda t, n: history.free_partition_keys_statement(n, PARTITION, t),
    "prune_default": lambda t, n: history.prune_default_statement(n, n.done, t),
    "detach_partition": lambda t, n: history.detach_partition_statement(n, n.done, PARTITION),
    "drop_partition": lambda t, n: history.drop_partition_statement(n, PARTITION),
}


@pytest.fixture
def tables() -> QueueTables:
    return build_tables(MetaData(), schema="app", prefix="q_", history="partitioned")


def _rendered(tables: QueueTables) -> str:
    names = history_names(tables)
    parts = [
        f"-- {name}\n{BUILDERS[name](tables, names).compile(dialect=DIALECT)}\n"
        for name in BUILDERS
    ]
    for interval in ("day", "month"):
        ddl = "\n".join(structure_statements(names, interval))
        parts.append(f"-- structure ({interval})\n{ddl}\n")
    return "\n".join(parts)


def test_history_statements_match_their_snapshot(tables: QueueTables) -> None:
    rendered = _rendered(tables)
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(rendered)
    assert rendered == SNAPSHOT.read_text()


def test_every_statement_of_the_module_is_snapshotted() -> None:
    named = {name.removesuffix("_wait").removesuffix("_try") for name in BUILDERS}
    assert {f"{name}_statement" for name in named} == set(history.__all__)


def test_names_are_quoted_and_follow_a_translated_schema(tables: QueueTables) -> None:
    moved = history_names(tables, {"app": "Tenant 1"})
    sql = str(history.drop_partition_statement(moved, PARTITION))
    assert sql == f'DROP TABLE "Tenant 1".{PARTITION}'
    assert str(history.drop_partition_statement(history_names(tables, {"app": None}), "x")) == (
        "DROP TABLE x"
    )


def test_the_lock_timeout_is_whole_milliseconds() -> None:
    assert str(history.lock_timeout_statement(0.25)) == "SET LOCAL lock_timeout = '250ms'"
