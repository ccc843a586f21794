"""The autogenerate comparator's decisions, without a database.

Finding queues in metadata, choosing the one operation per queue, and rewriting Alembic's
proposals are pure functions; the database-backed run is in tests/migration. The
``clean_alembic`` fixture isolates the registration tests from each other.
"""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import comparators
from alembic.operations import MigrateOperation
from alembic.operations.ops import (
    AddColumnOp,
    CreateIndexOp,
    CreateTableOp,
    DropTableOp,
    ModifyTableOps,
    UpgradeOps,
)
from sqlalchemy import Column, Integer, MetaData, Table

import alembic_ext
from alembic_ext import CreateQueueOp, DropQueueOp, UpgradeQueueOp
from alembic_ext._registration import _hook_slots
from alembic_ext.compare import (
    QueueSchemaWarning,
    QueueTarget,
    find_queues,
    plan_queue_op,
    rewrite_upgrade_ops,
)
from sqla_queue.models.tables import SCHEMA_VERSION, build_tables
from sqla_queue.schema.manifest import index_shape, normalize_type

pytestmark = pytest.mark.unit


def target(version: int = SCHEMA_VERSION, schema: str | None = "work") -> QueueTarget:
    """A queue whose model wants ``version``."""
    return QueueTarget(build_tables(MetaData(), schema=schema), version)


# -- finding queues ---------------------------------------------------------------------------


def test_queues_are_found_through_metadata_info() -> None:
    metadata = MetaData()
    a = build_tables(metadata, schema="work", prefix="a_")
    b = build_tables(metadata, prefix="b_")

    found = find_queues(metadata)

    assert [(q.schema, q.prefix, q.version) for q in found] == [
        ("work", "a_", SCHEMA_VERSION),
        (None, "b_", SCHEMA_VERSION),
    ]
    assert found[0].tables.jobs is a.jobs and found[1].tables.executions is b.executions
    assert found[0].tables.limits is a.limits and found[1].tables.limits is b.limits
    assert found[0].tables.limits is a.limits
    assert (
        found[0].tables.unique_keys is a.unique_keys
        and found[1].tables.unique_keys is b.unique_keys
    )
    assert found[0].tables.controls is a.controls and found[1].tables.controls is b.controls
    assert (
        found[0].tables.rate_starts is a.rate_starts
        and found[1].tables.rate_starts is b.rate_starts
    )
    assert found[0].tables.schedules is a.schedules and found[1].tables.schedules is b.schedules
    assert found[0].tables.daemons is a.daemons and found[1].tables.daemons is b.daemons
    assert found[0].tables.workers is a.workers and found[1].tables.workers is b.workers
    assert found[0].tables.workflows is a.workflows and found[1].tables.workflows is b.workflows
    assert (
        found[0].tables.workflow_nodes is a.workflow_nodes
        and found[1].tables.workflow_nodes is b.workflow_nodes
    )
    assert (
        found[0].tables.workflow_edges is a.workflow_edges
        and found[1].tables.workflow_edges is b.workflow_edges
    )
    assert found[0].tables.job_steps is a.job_steps and found[1].tables.job_steps is b.job_steps
    assert (
        found[0].tables.job_signals is a.job_signals
        and found[1].tables.job_signals is b.job_signals
    )
    assert found[0].tables.all == a.all and found[1].tables.all == b.all
    assert find_queues(None) == []
    assert find_queues(MetaData()) == []


def test_tables_copied_to_another_metadata_are_found_by_their_tags() -> None:
    tables = build_tables(MetaData(), schema="work")
    copy = MetaData()
    for table in tables.all:
        table.to_metadata(copy)
    lonely = MetaData()
    tables.jobs.to_metadata(lonely)  # part of a queue is not a queue
    tables.executions.to_metadata(lonely)
    short = MetaData()  # nor are the three tables of version 3 without the fourth
    for table in (tables.jobs, tables.executions, tables.limits):
        table.to_metadata(short)
    version_4 = MetaData()  # nor the four tables of version 4 without those of version 5
    for table in (tables.jobs, tables.executions, tables.limits, tables.unique_keys):
        table.to_metadata(version_4)
    version_5 = MetaData()  # nor the nine tables of version 5 without those of version 6
    for table in tables.all:
        if table not in (tables.workflows, tables.workflow_nodes, tables.workflow_edges):
            table.to_metadata(version_5)
    version_6 = MetaData()  # nor the twelve tables of version 6 without those of version 7
    for table in tables.all:
        if table not in (tables.job_steps, tables.job_signals):
            table.to_metadata(version_6)
    almost = MetaData()  # nor all but one of version 7's
    for table in tables.all:
        if table is not tables.workers:
            table.to_metadata(almost)

    [found] = find_queues([copy, lonely])
    assert find_queues(short) == []
    assert find_queues(version_4) == []
    assert find_queues(version_5) == []
    assert find_queues(version_6) == []
    assert find_queues(almost) == []

    assert (found.schema, found.prefix, found.version) == ("work", "sqla_queue_", SCHEMA_VERSION)
    assert found.tables.jobs is copy.tables["work.sqla_queue_jobs"]
    assert found.tables.limits is copy.tables["work.sqla_queue_task_limits"]
    assert found.tables.unique_keys is copy.tables["work.sqla_queue_unique_keys"]
    assert found.tables.controls is copy.tables["work.sqla_queue_task_controls"]
    assert found.tables.rate_starts is copy.tables["work.sqla_queue_rate_starts"]
    assert found.tables.schedules is copy.tables["work.sqla_queue_schedules"]
    assert found.tables.daemons is copy.tables["work.sqla_queue_daemons"]
    assert found.tables.workers is copy.tables["work.sqla_queue_workers"]
    assert found.tables.workflows is copy.tables["work.sqla_queue_workflows"]
    assert found.tables.workflow_nodes is copy.tables["work.sqla_queue_workflow_nodes"]
    assert found.tables.workflow_edges is copy.tables["work.sqla_queue_workflow_edges"]
    assert found.tables.job_steps is copy.tables["work.sqla_queue_job_steps"]
    assert found.tables.job_signals is copy.tables["work.sqla_queue_job_signals"]


def test_the_target_version_comes_from_the_model() -> None:
    metadata = MetaData()
    tables = build_tables(metadata)
    tables.executions.info["sqla_queue"]["schema_version"] = 9
    assert find_queues(metadata)[0].version == 9


# -- choosing the operation -------------------------------------------------------------------


def test_no_tables_means_create_at_the_model_version() -> None:
    assert plan_queue_op(target(3), None) == CreateQueueOp("work", "sqla_queue_", version=3)


def test_same_version_means_nothing() -> None:
    assert plan_queue_op(target(2), 2) is None


def test_older_version_means_upgrade_from_there() -> None:
    assert plan_queue_op(target(3), 1) == UpgradeQueueOp(1, 3, "work", "sqla_queue_")


@pytest.mark.parametrize("db_version", [1, 2, 3, 4, 5, 6])
def test_an_older_database_under_the_current_model_gets_the_real_step(db_version: int) -> None:
    assert SCHEMA_VERSION == 7
    assert plan_queue_op(target(), db_version) == UpgradeQueueOp(
        db_version, 7, "work", "sqla_queue_"
    )


@pytest.mark.parametrize(
    ("db_version", "existing", "message"),
    [
        (5, ["sqla_queue_jobs"], "newer than this library"),
        (0, ["sqla_queue_jobs"], "no schema version comment"),
        (None, ["sqla_queue_jobs"], "sqla_queue_jobs found .* half-installed"),
        (None, ["sqla_queue_task_limits"], "sqla_queue_task_limits found .* half-installed"),
        (None, ["sqla_queue_unique_keys"], "sqla_queue_unique_keys found .* half-installed"),
        (None, ["sqla_queue_daemons"], "sqla_queue_daemons found .* half-installed"),
        (None, ["sqla_queue_task_controls"], "sqla_queue_task_controls found .* half-installed"),
        (None, ["sqla_queue_workflow_nodes"], "sqla_queue_workflow_nodes found .* half-installed"),
        (None, ["sqla_queue_job_steps"], "sqla_queue_job_steps found .* half-installed"),
    ],
)
def test_odd_databases_are_left_alone_with_a_warning(
    db_version: int | None, existing: list[str], message: str
) -> None:
    with pytest.warns(QueueSchemaWarning, match=message):
        assert plan_queue_op(target(1), db_version, existing_tables=existing) is None


# -- rewriting Alembic's proposals ------------------------------------------------------------


def _alembic_proposals() -> tuple[UpgradeOps, set[tuple[str | None, str]]]:
    """What Alembic proposes for a host table plus a queue in the default schema ``public``."""
    metadata = MetaData()
    host = Table("accounts", metadata, Column("id", Integer, primary_key=True))
    queue = build_tables(metadata, schema="public")
    ops: list[MigrateOperation] = [
        CreateTableOp.from_table(queue.jobs),
        CreateTableOp.from_table(host),
        CreateTableOp.from_table(queue.limits),
        CreateTableOp.from_table(queue.unique_keys),
        CreateTableOp.from_table(queue.controls),
        CreateTableOp.from_table(queue.rate_starts),
        CreateTableOp.from_table(queue.schedules),
        CreateTableOp.from_table(queue.daemons),
        CreateTableOp.from_table(queue.workers),
        CreateTableOp.from_table(queue.workflows),
        CreateTableOp.from_table(queue.workflow_nodes),
        CreateTableOp.from_table(queue.workflow_edges),
        CreateTableOp.from_table(queue.job_steps),
        CreateTableOp.from_table(queue.job_signals),
        ModifyTableOps(
            "sqla_queue_job_executions",
            [AddColumnOp("sqla_queue_job_executions", Column("x", Integer))],
            schema="public",
        ),
        ModifyTableOps(
            "accounts",
            [CreateIndexOp("ix_accounts_id", "accounts", ["id"])],
        ),
    ]
    owned: set[tuple[str | None, str]] = {
        (None, "sqla_queue_jobs"),
        (None, "sqla_queue_job_executions"),
        (None, "sqla_queue_task_limits"),
        (None, "sqla_queue_unique_keys"),
        (None, "sqla_queue_task_controls"),
        (None, "sqla_queue_rate_starts"),
        (None, "sqla_queue_schedules"),
        (None, "sqla_queue_daemons"),
        (None, "sqla_queue_workers"),
        (None, "sqla_queue_workflows"),
        (None, "sqla_queue_workflow_nodes"),
        (None, "sqla_queue_workflow_edges"),
        (None, "sqla_queue_job_steps"),
        (None, "sqla_queue_job_signals"),
    }
    return UpgradeOps(ops=ops), owned


def test_alembic_proposals_for_queue_tables_give_way_to_the_queue_op() -> None:
    upgrade_ops, owned = _alembic_proposals()
    create = CreateQueueOp("public", "sqla_queue_", version=7)

    rewrite_upgrade_ops(upgrade_ops, [create], owned, default_schema="public")

    assert upgrade_ops.ops[0] is create
    assert [getattr(op, "table_name", None) for op in upgrade_ops.ops[1:]] == [
        "accounts",
        "accounts",
    ]


def _dropped(name: str, schema: str | None, comment: str | None) -> DropTableOp:
    table = Table(name, MetaData(), Column("id", Integer), schema=schema, comment=comment)
    return DropTableOp.from_table(table)


def test_dropping_both_version_1_tables_becomes_one_drop_queue_at_the_end() -> None:
    upgrade_ops = UpgradeOps(
        ops=[
            _dropped("q_job_executions", "work", "sqla_queue schema version 1"),
            _dropped("legacy", None, None),
            _dropped("q_jobs", "work", "sqla_queue: durable record of every job"),
        ]
    )

    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")

    assert [type(op) for op in upgrade_ops.ops] == [DropTableOp, DropQueueOp]
    assert upgrade_ops.ops[-1] == DropQueueOp("work", "q_", version=1)


def test_dropping_all_fourteen_version_7_tables_becomes_one_drop_queue() -> None:
    """drop_queue(version=7) drops the two durable job tables too: none may stay behind."""
    upgrade_ops = UpgradeOps(
        ops=[
            _dropped("q_job_signals", "work", "sqla_queue: signals sent to durable jobs"),
            _dropped("q_job_steps", "work", None),
            _dropped("q_workflow_edges", "work", None),
            _dropped("q_workflow_nodes", "work", None),
            _dropped("q_workflows", "work", "sqla_queue: workflows"),
            _dropped("q_workers", "work", "sqla_queue: live workers"),
            _dropped("q_daemons", "work", "sqla_queue: daemon instances"),
            _dropped("q_schedules", "work", None),
            _dropped("q_rate_starts", "work", None),
            _dropped("q_task_controls", "work", None),
            _dropped("q_unique_keys", "work", None),
            _dropped("q_task_limits", "work", None),
            _dropped("q_job_executions", "work", "sqla_queue schema version 7"),
            _dropped("q_jobs", "work", None),
        ]
    )

    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")

    assert upgrade_ops.ops == [DropQueueOp("work", "q_", version=7)]


def test_dropping_all_twelve_version_6_tables_becomes_one_drop_queue() -> None:
    """drop_queue(version=6) drops the three workflow tables too: none may stay behind."""
    upgrade_ops = UpgradeOps(
        ops=[
            _dropped("q_workflow_edges", "work", None),
            _dropped("q_workflow_nodes", "work", None),
            _dropped("q_workflows", "work", "sqla_queue: workflows"),
            _dropped("q_workers", "work", "sqla_queue: live workers"),
            _dropped("q_daemons", "work", "sqla_queue: daemon instances"),
            _dropped("q_schedules", "work", None),
            _dropped("q_rate_starts", "work", None),
            _dropped("q_task_controls", "work", None),
            _dropped("q_unique_keys", "work", None),
            _dropped("q_task_limits", "work", None),
            _dropped("q_job_executions", "work", "sqla_queue schema version 6"),
            _dropped("q_jobs", "work", None),
        ]
    )

    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")

    assert upgrade_ops.ops == [DropQueueOp("work", "q_", version=6)]


def test_dropping_all_nine_version_5_tables_becomes_one_drop_queue() -> None:
    """drop_queue(version=5) drops the five tables of version 5 too: none may stay behind."""
    upgrade_ops = UpgradeOps(
        ops=[
            _dropped("q_workers", "work", "sqla_queue: live workers"),
            _dropped("q_daemons", "work", "sqla_queue: daemon instances"),
            _dropped("q_schedules", "work", None),
            _dropped("q_rate_starts", "work", None),
            _dropped("q_task_controls", "work", None),
            _dropped("q_unique_keys", "work", None),
            _dropped("q_task_limits", "work", None),
            _dropped("q_job_executions", "work", "sqla_queue schema version 5"),
            _dropped("q_jobs", "work", None),
        ]
    )

    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")

    assert upgrade_ops.ops == [DropQueueOp("work", "q_", version=5)]


def test_dropping_all_four_version_4_tables_becomes_one_drop_queue() -> None:
    """drop_queue(version=4) drops unique_keys too: no drop_table of it may stay behind."""
    upgrade_ops = UpgradeOps(
        ops=[
            _dropped("q_unique_keys", "work", "sqla_queue: unique job keys"),
            _dropped("q_task_limits", "work", None),
            _dropped("q_job_executions", "work", "sqla_queue schema version 4"),
            _dropped("q_jobs", "work", None),
        ]
    )

    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")

    assert upgrade_ops.ops == [DropQueueOp("work", "q_", version=4)]


def test_dropping_all_three_version_2_tables_becomes_one_drop_queue() -> None:
    """drop_queue(version=2) drops task_limits too: no drop_table of it may stay behind."""
    upgrade_ops = UpgradeOps(
        ops=[
            _dropped("q_task_limits", None, "sqla_queue: concurrency limit per task"),
            _dropped("q_job_executions", None, "sqla_queue schema version 2"),
            _dropped("legacy", None, None),
            _dropped("q_jobs", None, None),
        ]
    )

    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")

    assert [type(op) for op in upgrade_ops.ops] == [DropTableOp, DropQueueOp]
    assert getattr(upgrade_ops.ops[0], "table_name", None) == "legacy"
    assert upgrade_ops.ops[-1] == DropQueueOp(None, "q_", version=2)


@pytest.mark.parametrize(
    "ops",
    [
        # No version comment: somebody else's table that happens to share the name.
        [_dropped("q_job_executions", None, "mine"), _dropped("q_jobs", None, None)],
        # Only one of the two tables is going away.
        [_dropped("q_job_executions", None, "sqla_queue schema version 1")],
        # Version 2 has three tables; a filter keeps task_limits, so drop_queue cannot run.
        [
            _dropped("q_job_executions", None, "sqla_queue schema version 2"),
            _dropped("q_jobs", None, None),
        ],
        # Version 4 has four tables; a filter keeps unique_keys, so drop_queue cannot run.
        [
            _dropped("q_job_executions", None, "sqla_queue schema version 4"),
            _dropped("q_jobs", None, None),
            _dropped("q_task_limits", None, None),
        ],
        # Version 5 has nine tables; a filter keeps workers, so drop_queue cannot run.
        [
            _dropped("q_job_executions", None, "sqla_queue schema version 5"),
            _dropped("q_jobs", None, None),
            _dropped("q_task_limits", None, None),
            _dropped("q_unique_keys", None, None),
            _dropped("q_task_controls", None, None),
            _dropped("q_rate_starts", None, None),
            _dropped("q_schedules", None, None),
            _dropped("q_daemons", None, None),
        ],
        # Version 6 has twelve tables; a filter keeps workflow_edges, so drop_queue cannot run.
        [
            _dropped("q_job_executions", None, "sqla_queue schema version 6"),
            _dropped("q_jobs", None, None),
            _dropped("q_task_limits", None, None),
            _dropped("q_unique_keys", None, None),
            _dropped("q_task_controls", None, None),
            _dropped("q_rate_starts", None, None),
            _dropped("q_schedules", None, None),
            _dropped("q_daemons", None, None),
            _dropped("q_workers", None, None),
            _dropped("q_workflows", None, None),
            _dropped("q_workflow_nodes", None, None),
        ],
        # Version 7 has fourteen tables; a filter keeps job_signals, so drop_queue cannot run.
        [
            _dropped("q_job_executions", None, "sqla_queue schema version 7"),
            _dropped("q_jobs", None, None),
            _dropped("q_task_limits", None, None),
            _dropped("q_unique_keys", None, None),
            _dropped("q_task_controls", None, None),
            _dropped("q_rate_starts", None, None),
            _dropped("q_schedules", None, None),
            _dropped("q_daemons", None, None),
            _dropped("q_workers", None, None),
            _dropped("q_workflows", None, None),
            _dropped("q_workflow_nodes", None, None),
            _dropped("q_workflow_edges", None, None),
            _dropped("q_job_steps", None, None),
        ],
        # A version this library does not know: which tables it has is unknown.
        [
            _dropped("q_job_executions", None, "sqla_queue schema version 99"),
            _dropped("q_jobs", None, None),
            _dropped("q_task_limits", None, None),
        ],
    ],
)
def test_other_drops_are_left_as_alembic_proposed(ops: list[MigrateOperation]) -> None:
    upgrade_ops = UpgradeOps(ops=list(ops))
    rewrite_upgrade_ops(upgrade_ops, [], set(), default_schema="public")
    assert upgrade_ops.ops == ops


# -- registration ----------------------------------------------------------------------------


def _our_hooks() -> dict[tuple[Any, ...], list[str]]:
    """Our hooks in Alembic's global comparator registry, by registry key."""
    found: dict[tuple[Any, ...], list[str]] = {}
    for key, entries in comparators._registry.items():
        for entry in entries if isinstance(entries, list) else []:
            fn = entry[0] if isinstance(entry, tuple) else entry
            if fn.__module__ == "alembic_ext._registration":
                found.setdefault(key, []).append(fn.__name__)
    return found


def test_hooks_sit_before_and_after_alembics_own_comparison_once(clean_alembic: None) -> None:
    assert _our_hooks() == {}
    alembic_ext.install()
    alembic_ext.install()
    expected: dict[tuple[Any, ...], list[str]] = {}
    for slot, hook in _hook_slots():
        expected.setdefault(slot, []).append(hook.__name__)
    assert _our_hooks() == expected
    if len(expected) == 2:  # Alembic 1.18+: FIRST hides the queue tables, LAST writes the ops
        assert {slot[2].name for slot in expected} == {"FIRST", "LAST"}
    else:  # older Alembic: one list, run in order, with Alembic's table comparison between
        [(slot, names)] = expected.items()
        entries = comparators._registry[slot]
        assert entries[0].__name__ == names[0] and entries[-1].__name__ == names[-1]
        assert len(entries) > 2
    alembic_ext.uninstall()
    assert _our_hooks() == {}


# -- shapes that verification compares --------------------------------------------------------


@pytest.mark.parametrize(
    ("from_sqlalchemy", "from_postgresql"),
    [
        (
            "CREATE UNIQUE INDEX u ON s.t (queue_id) WHERE state = 'running' AND "
            "queue_id IS NOT NULL",
            "CREATE UNIQUE INDEX u ON s.t USING btree (queue_id) "
            "WHERE ((state = 'running'::text) AND (queue_id IS NOT NULL))",
        ),
        (
            "CREATE INDEX c ON t (priority DESC, execute_at, id) WHERE state = 'pending'",
            "CREATE INDEX c ON public.t USING btree (priority DESC, execute_at, id) "
            "WHERE (state = 'pending'::text)",
        ),
        (
            "CREATE INDEX v ON t (a) WHERE b = 'x'",
            "CREATE INDEX v ON t USING btree (a) WHERE ((b)::text = 'x'::character varying(20))",
        ),
    ],
)
def test_index_shapes_agree_across_both_spellings(
    from_sqlalchemy: str, from_postgresql: str
) -> None:
    assert index_shape(from_sqlalchemy) == index_shape(from_postgresql)


def test_index_shapes_tell_uniqueness_and_predicates_apart() -> None:
    unique = index_shape("CREATE UNIQUE INDEX u ON t USING btree (q) WHERE (s = 'running'::text)")
    plain = index_shape("CREATE INDEX u ON t USING btree (q) WHERE (s = 'running'::text)")
    other = index_shape("CREATE UNIQUE INDEX u ON t USING btree (q) WHERE (s = 'pending'::text)")
    assert len({unique, plain, other}) == 3


@pytest.mark.parametrize(
    ("sqlalchemy", "postgresql"),
    [
        ("BIGINT", "bigint"),
        ("TIMESTAMP WITH TIME ZONE", "timestamp with time zone"),
        ("VARCHAR(20)", "character varying(20)"),
        ("DOUBLE PRECISION", "double precision"),
    ],
)
def test_column_types_are_compared_in_postgresql_spelling(sqlalchemy: str, postgresql: str) -> None:
    assert normalize_type(sqlalchemy) == normalize_type(postgresql) == postgresql
