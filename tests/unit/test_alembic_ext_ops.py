"""The queue operations, their registration and the frozen SQL, without a database.

Every test that touches Alembic's registries starts from an Alembic without alembic_ext and
puts back whatever was there afterwards (the ``clean_alembic`` fixture), so no test depends on
another's registrations.
"""

from __future__ import annotations

import hashlib
import io

import pytest
from alembic.autogenerate import comparators
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext

import alembic_ext
from alembic_ext import (
    CreateQueueOp,
    DropQueueOp,
    PartitionHistoryOp,
    UnpartitionHistoryOp,
    UpgradeQueueOp,
    versions,
)
from alembic_ext._registration import _hook_slots
from alembic_ext.versions import UnknownSchemaVersionError, v1_to_v2
from sqla_queue.errors import InvalidIdentifierError

pytestmark = pytest.mark.unit

OPERATION_NAMES = (
    "create_queue",
    "drop_queue",
    "upgrade_queue",
    "partition_history",
    "unpartition_history",
)


def offline_operations() -> tuple[Operations, io.StringIO]:
    """Operations that print SQL (as ``alembic upgrade --sql`` does) into a buffer."""
    buffer = io.StringIO()
    context = MigrationContext.configure(
        dialect_name="postgresql", opts={"as_sql": True, "output_buffer": buffer}
    )
    return Operations(context), buffer


def printed(statements: list[str]) -> str:
    """How Alembic's offline mode prints a list of statements."""
    return "".join(f"{statement};\n\n" for statement in statements)


def _our_hooks() -> int:
    return sum(
        1
        for entries in comparators._registry.values()
        if isinstance(entries, list)
        for entry in entries
        if getattr(entry[0] if isinstance(entry, tuple) else entry, "__module__", "")
        == "alembic_ext._registration"
    )


def test_install_registers_and_uninstall_removes_everything(clean_alembic: None) -> None:
    assert not any(hasattr(Operations, name) for name in OPERATION_NAMES)
    assert _our_hooks() == 0

    alembic_ext.install()
    alembic_ext.install()  # idempotent

    assert all(callable(getattr(Operations, name)) for name in OPERATION_NAMES)
    assert _our_hooks() == len(_hook_slots())
    for op_class in (CreateQueueOp, DropQueueOp, UpgradeQueueOp):
        assert Operations._to_impl.dispatch(op_class) is not None

    alembic_ext.uninstall()

    assert not any(hasattr(Operations, name) for name in OPERATION_NAMES)
    assert _our_hooks() == 0
    with pytest.raises(ValueError, match="no dispatch function"):
        Operations._to_impl.dispatch(CreateQueueOp)


def test_create_queue_prints_the_frozen_statements_offline(clean_alembic: None) -> None:
    alembic_ext.install()
    operations, buffer = offline_operations()

    operations.create_queue(schema="work", prefix="q_", version=1)  # type: ignore[attr-defined]

    assert buffer.getvalue() == printed(versions.create_statements(1, "work", "q_"))
    assert buffer.getvalue().startswith("CREATE SCHEMA IF NOT EXISTS work;")


def test_drop_and_upgrade_print_their_statements_offline(clean_alembic: None) -> None:
    alembic_ext.install()
    operations, buffer = offline_operations()

    operations.drop_queue(version=1)  # type: ignore[attr-defined]
    operations.upgrade_queue(1, 1)  # type: ignore[attr-defined]

    assert buffer.getvalue() == (
        "DROP TABLE sqla_queue_job_executions;\n\nDROP TABLE sqla_queue_jobs;\n\n"
    )


def test_the_version_2_operations_print_the_real_step_offline(clean_alembic: None) -> None:
    alembic_ext.install()
    operations, buffer = offline_operations()

    operations.upgrade_queue(1, 2, schema="work")  # type: ignore[attr-defined]
    up = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    operations.upgrade_queue(from_version=2, to_version=1, schema="work")  # type: ignore[attr-defined]
    down = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    operations.drop_queue(version=2)  # type: ignore[attr-defined]

    assert up == printed(v1_to_v2.upgrade_statements("work", "sqla_queue_"))
    assert up.startswith("ALTER TABLE work.sqla_queue_job_executions ADD COLUMN slot INTEGER;")
    assert (
        "CREATE UNIQUE INDEX sqla_queue_job_executions_slot_uq ON work.sqla_queue_job_executions"
        " (task, slot) WHERE slot IS NOT NULL;" in up
    )
    assert "CREATE TABLE work.sqla_queue_task_limits (" in up
    assert up.endswith(
        "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 2';\n\n"
    )
    assert down == printed(v1_to_v2.downgrade_statements("work", "sqla_queue_"))
    assert down.endswith("IS 'sqla_queue schema version 1';\n\n")
    assert buffer.getvalue() == (
        "DROP TABLE sqla_queue_task_limits;\n\n"
        "DROP TABLE sqla_queue_job_executions;\n\nDROP TABLE sqla_queue_jobs;\n\n"
    )


def test_version_is_required_and_checked(clean_alembic: None) -> None:
    alembic_ext.install()
    operations, _ = offline_operations()
    with pytest.raises(TypeError, match="version"):
        operations.create_queue(schema="work")  # type: ignore[attr-defined]
    for bad in (0, True, "1", None):
        with pytest.raises(TypeError, match="positive int schema version"):
            CreateQueueOp(version=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="to_version"):
        UpgradeQueueOp(1, -1)


def test_bad_identifiers_are_refused_before_any_sql() -> None:
    with pytest.raises(InvalidIdentifierError, match="schema"):
        CreateQueueOp("Work; DROP", version=1)
    with pytest.raises(InvalidIdentifierError, match="prefix"):
        DropQueueOp(None, "Bad-Prefix", version=1)


def test_an_unknown_version_names_the_fix(clean_alembic: None) -> None:
    alembic_ext.install()
    operations, buffer = offline_operations()
    with pytest.raises(UnknownSchemaVersionError, match="upgrade sqla_queue"):
        operations.create_queue(version=99)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""


def test_each_op_reverses_into_its_counterpart() -> None:
    create = CreateQueueOp("work", "q_", version=1)
    upgrade = UpgradeQueueOp(1, 3, "work", "q_")

    assert create.reverse() == DropQueueOp("work", "q_", version=1)
    assert create.reverse().reverse() == create
    assert upgrade.reverse() == UpgradeQueueOp(3, 1, "work", "q_")
    assert create.to_diff_tuple() == ("create_queue", "work", "q_", 1)
    assert upgrade.to_diff_tuple() == ("upgrade_queue", "work", "q_", 1, 3)
    assert repr(create) == "CreateQueueOp(schema='work', prefix='q_', version=1)"
    assert len({create, CreateQueueOp("work", "q_", version=1)}) == 1


def test_history_ops_reverse_into_each_other_and_keep_the_layout() -> None:
    create = CreateQueueOp("work", "q_", version=5, history="partitioned")
    assert create.reverse() == DropQueueOp("work", "q_", version=5, history="partitioned")
    assert create.reverse().reverse() == create
    assert create != CreateQueueOp("work", "q_", version=5)
    assert create.to_diff_tuple() == ("create_queue", "work", "q_", 5, "partitioned")
    assert repr(create) == (
        "CreateQueueOp(schema='work', prefix='q_', version=5, history='partitioned')"
    )
    partition = PartitionHistoryOp("work", "q_", version=5, interval="hour")
    assert partition.reverse() == UnpartitionHistoryOp("work", "q_", version=5)
    assert partition.to_diff_tuple() == ("partition_history", "work", "q_", 5, "hour")
    with pytest.raises(ValueError, match="interval must be one of"):
        PartitionHistoryOp("work", "q_", version=5, interval="fortnight")
    with pytest.raises(ValueError, match="history must be"):
        CreateQueueOp("work", "q_", version=5, history="sideways")


def test_partitioned_history_is_frozen_for_versions_5_6_and_7_only() -> None:
    from alembic_ext.versions.history import partition_statements, unpartition_statements

    with pytest.raises(ValueError, match="frozen for schema version"):
        partition_statements(4, None, "q_")
    with pytest.raises(ValueError, match="frozen for schema version"):
        partition_statements(8, None, "q_")
    # Versions 6 and 7 left the jobs table as version 5 had it: the same statements serve all.
    for later in (6, 7):
        assert partition_statements(later, "user", "q_") == partition_statements(5, "user", "q_")
        assert unpartition_statements(later, "user", "q_") == (
            unpartition_statements(5, "user", "q_")
        )
    with pytest.raises(ValueError, match="interval must be one of"):
        partition_statements(5, None, "q_", "fortnight")
    statements = partition_statements(5, "user", "q_")
    assert statements[0] == 'ALTER TABLE "user".q_jobs RENAME TO q_jobs_old'
    assert any(s.endswith("PARTITION BY LIST (status)") for s in statements)
    assert statements[-1] == 'DROP TABLE "user".q_jobs_old'


def test_identifiers_in_the_frozen_sql_are_quoted_by_postgresql_rules() -> None:
    statements = versions.create_statements(1, "user", "q_")
    assert statements[0] == 'CREATE SCHEMA IF NOT EXISTS "user"'
    assert statements[1].startswith('CREATE TABLE "user".q_jobs (')
    assert 'REFERENCES "user".q_jobs (id)' in statements[5]
    assert versions.drop_statements(1, None, "q_") == [
        "DROP TABLE q_job_executions",
        "DROP TABLE q_jobs",
    ]
    step = versions.migrate_statements(1, 2, "user", "q_")
    assert step[0] == 'ALTER TABLE "user".q_job_executions ADD COLUMN slot INTEGER'
    # An index lives in its table's schema: its own name is never qualified.
    assert step[1].startswith('CREATE UNIQUE INDEX q_job_executions_slot_uq ON "user".q_job')
    assert step[2].startswith('CREATE INDEX q_job_executions_task_claim_ix ON "user".q_job')
    assert step[4].startswith('CREATE TABLE "user".q_task_limits (')


def test_each_release_knows_its_tables() -> None:
    assert versions.table_suffixes(1) == ("jobs", "job_executions")
    assert versions.table_suffixes(2) == ("jobs", "job_executions", "task_limits")
    assert versions.table_suffixes(3) == versions.table_suffixes(2)
    assert versions.table_suffixes(4) == ("jobs", "job_executions", "task_limits", "unique_keys")
    assert versions.table_suffixes(5) == (
        *versions.table_suffixes(4),
        "task_controls",
        "rate_starts",
        "schedules",
        "daemons",
        "workers",
    )
    assert versions.table_suffixes(6) == (
        *versions.table_suffixes(5),
        "workflows",
        "workflow_nodes",
        "workflow_edges",
    )
    assert versions.table_suffixes(7) == (*versions.table_suffixes(6), "job_steps", "job_signals")
    with pytest.raises(UnknownSchemaVersionError):
        versions.table_suffixes(99)


def test_version_1_is_frozen() -> None:
    """A tripwire: the released text of version 1 must never change (add a version instead)."""
    text = "\n".join(
        versions.create_statements(1, "s", "p_") + versions.drop_statements(1, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V1_SHA256, text


FROZEN_V1_SHA256 = "abd80786090ae5e905e47ad877b69018170dba151acb68a0977d14e3c57c8582"


def test_version_2_and_its_step_are_frozen() -> None:
    """The same tripwire for version 2 as released: its create, drop and the 1-2 step."""
    text = "\n".join(
        versions.create_statements(2, "s", "p_")
        + versions.drop_statements(2, "s", "p_")
        + versions.migrate_statements(1, 2, "s", "p_")
        + versions.migrate_statements(2, 1, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V2_SHA256, text


FROZEN_V2_SHA256 = "323ba5b371c050c6ffa0d33d162fbd52cb2624518a08d5b57537b8d31e14b66a"


def test_version_3_and_its_step_are_frozen() -> None:
    """The same tripwire for version 3 as released: its create, drop and the 2-3 step."""
    text = "\n".join(
        versions.create_statements(3, "s", "p_")
        + versions.drop_statements(3, "s", "p_")
        + versions.migrate_statements(2, 3, "s", "p_")
        + versions.migrate_statements(3, 2, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V3_SHA256, text


FROZEN_V3_SHA256 = "c9a365806fd24e0c4ebf74026fd6e9f16064a03ab9906e098331f97cfaf54a06"


def test_version_4_and_its_step_are_frozen() -> None:
    """The same tripwire for version 4 as released: its create, drop and the 3-4 step."""
    text = "\n".join(
        versions.create_statements(4, "s", "p_")
        + versions.drop_statements(4, "s", "p_")
        + versions.migrate_statements(3, 4, "s", "p_")
        + versions.migrate_statements(4, 3, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V4_SHA256, text


FROZEN_V4_SHA256 = "6d377939f62ea2011653a257952a0a4aca99a9144aa626c8f251cdd26fc0f507"


def test_version_5_and_its_step_are_frozen() -> None:
    """The same tripwire for version 5 as released: its create, drop and the 4-5 step."""
    text = "\n".join(
        versions.create_statements(5, "s", "p_")
        + versions.drop_statements(5, "s", "p_")
        + versions.migrate_statements(4, 5, "s", "p_")
        + versions.migrate_statements(5, 4, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V5_SHA256, text


FROZEN_V5_SHA256 = "d708c959c6193d92ece1e87bf741b4108c084cde5a1ce92b59299946fc46d5da"


def test_version_6_and_its_step_are_frozen() -> None:
    """The same tripwire for version 6 as released: its create, drop and the 5-6 step."""
    text = "\n".join(
        versions.create_statements(6, "s", "p_")
        + versions.drop_statements(6, "s", "p_")
        + versions.migrate_statements(5, 6, "s", "p_")
        + versions.migrate_statements(6, 5, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V6_SHA256, text


FROZEN_V6_SHA256 = "90f444305b885313893bbddfbcda69b866d66dd0613ea108e147a51a17569261"


def test_version_7_and_its_step_are_frozen() -> None:
    """The same tripwire for version 7 as released: its create, drop and the 6-7 step."""
    text = "\n".join(
        versions.create_statements(7, "s", "p_")
        + versions.drop_statements(7, "s", "p_")
        + versions.migrate_statements(6, 7, "s", "p_")
        + versions.migrate_statements(7, 6, "s", "p_")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == FROZEN_V7_SHA256, text


FROZEN_V7_SHA256 = "5ab485b379a20b8c2eeb1290d34e4fb34345b13cc040e0218338c122e8020ff2"


def test_each_version_is_the_previous_one_followed_by_the_step() -> None:
    for version in versions.known_versions()[1:]:
        assert versions.create_statements(version, "s", "p_") == (
            versions.create_statements(version - 1, "s", "p_")
            + versions.migrate_statements(version - 1, version, "s", "p_")
        ), version
    assert versions.drop_statements(4, None, "p_")[0] == "DROP TABLE p_unique_keys"
    assert versions.drop_statements(4, None, "p_")[1:] == versions.drop_statements(3, None, "p_")
    assert versions.drop_statements(5, None, "p_")[:5] == [
        "DROP TABLE p_workers",
        "DROP TABLE p_daemons",
        "DROP TABLE p_schedules",
        "DROP TABLE p_rate_starts",
        "DROP TABLE p_task_controls",
    ]
    assert versions.drop_statements(5, None, "p_")[5:] == versions.drop_statements(4, None, "p_")
    assert versions.drop_statements(6, None, "p_")[:3] == [
        "DROP TABLE p_workflow_edges",
        "DROP TABLE p_workflow_nodes",
        "DROP TABLE p_workflows",
    ]
    assert versions.drop_statements(6, None, "p_")[3:] == versions.drop_statements(5, None, "p_")
    assert versions.drop_statements(7, None, "p_")[:2] == [
        "DROP TABLE p_job_signals",
        "DROP TABLE p_job_steps",
    ]
    assert versions.drop_statements(7, None, "p_")[2:] == versions.drop_statements(6, None, "p_")


def test_the_step_to_version_4_adds_columns_in_place_and_the_downgrade_drops_them() -> None:
    up = versions.migrate_statements(3, 4, "user", "q_")
    down = versions.migrate_statements(4, 3, "user", "q_")
    assert up[0] == (
        'ALTER TABLE "user".q_jobs ADD COLUMN unique_key TEXT, ADD COLUMN about_table TEXT, '
        "ADD COLUMN about_key TEXT, ADD COLUMN awaited BOOLEAN DEFAULT false NOT NULL"
    )
    assert any(s.startswith('CREATE TABLE "user".q_unique_keys (') for s in up)
    assert up[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 4'"
    assert down[0] == 'DROP TABLE "user".q_unique_keys'
    assert down[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 3'"


def test_the_step_to_version_5_adds_tables_and_one_index_and_the_downgrade_drops_them() -> None:
    up = versions.migrate_statements(4, 5, "user", "q_")
    down = versions.migrate_statements(5, 4, "user", "q_")
    created = [s.split(" (")[0] for s in up if s.startswith("CREATE TABLE")]
    assert created == [
        'CREATE TABLE "user".q_task_controls',
        'CREATE TABLE "user".q_rate_starts',
        'CREATE TABLE "user".q_schedules',
        'CREATE TABLE "user".q_daemons',
        'CREATE TABLE "user".q_workers',
    ]
    assert not any(s.startswith("ALTER TABLE") for s in up)  # no existing row is touched
    # The index is built last: it locks the executions table until the migration commits.
    assert up[-2] == (
        'CREATE INDEX q_job_executions_task_waiting_ix ON "user".q_job_executions (task) '
        "WHERE state = 'waiting'"
    )
    assert up[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 5'"
    assert down[0] == 'DROP INDEX "user".q_job_executions_task_waiting_ix'
    assert down[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 4'"


def test_the_step_to_version_6_adds_tables_and_one_column_and_the_downgrade_drops_them() -> None:
    up = versions.migrate_statements(5, 6, "user", "q_")
    down = versions.migrate_statements(6, 5, "user", "q_")
    created = [s.split(" (")[0] for s in up if s.startswith("CREATE TABLE")]
    assert created == [
        'CREATE TABLE "user".q_workflows',
        'CREATE TABLE "user".q_workflow_nodes',
        'CREATE TABLE "user".q_workflow_edges',
    ]
    # The column is added last: it locks the executions table until the migration commits.
    assert [s for s in up if s.startswith("ALTER TABLE")] == [up[-2]]
    assert up[-2] == (
        'ALTER TABLE "user".q_job_executions ADD COLUMN workflow BOOLEAN DEFAULT false NOT NULL'
    )
    assert up[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 6'"
    assert down[0] == 'ALTER TABLE "user".q_job_executions DROP COLUMN workflow'
    assert down[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 5'"


def test_the_step_to_version_7_adds_tables_a_column_a_state_and_two_indexes() -> None:
    up = versions.migrate_statements(6, 7, "user", "q_")
    down = versions.migrate_statements(7, 6, "user", "q_")
    created = [s.split(" (")[0] for s in up if s.startswith("CREATE TABLE")]
    assert created == ['CREATE TABLE "user".q_job_steps', 'CREATE TABLE "user".q_job_signals']
    # The executions table is altered last: it stays locked until the migration commits.
    first_alter = next(i for i, s in enumerate(up) if s.startswith("ALTER TABLE"))
    assert all("q_job_executions" in s for s in up[first_alter:])
    assert up[first_alter] == 'ALTER TABLE "user".q_job_executions ADD COLUMN wait TEXT'
    assert any("'done', 'suspended')) NOT VALID" in s for s in up[first_alter:])
    assert up[-3:-1] == [
        'CREATE INDEX q_job_executions_suspended_ix ON "user".q_job_executions (execute_at) '
        "WHERE state = 'suspended'",
        'CREATE INDEX q_job_executions_wait_ix ON "user".q_job_executions (wait) '
        "WHERE state = 'suspended'",
    ]
    assert up[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 7'"
    # Suspended executions become pending before the narrower check comes back.
    assert down[0].startswith("UPDATE \"user\".q_job_executions SET state = 'pending'")
    assert next(i for i, s in enumerate(down) if "CHECK" in s) > 0
    assert 'ALTER TABLE "user".q_job_executions DROP COLUMN wait' in down
    assert down[-3:-1] == ['DROP TABLE "user".q_job_signals', 'DROP TABLE "user".q_job_steps']
    assert down[-1] == "COMMENT ON TABLE \"user\".q_job_executions IS 'sqla_queue schema version 6'"


def test_version_2_is_version_1_followed_by_the_step() -> None:
    assert versions.create_statements(2, "s", "p_") == (
        versions.create_statements(1, "s", "p_") + versions.migrate_statements(1, 2, "s", "p_")
    )
    assert versions.drop_statements(2, None, "p_")[0] == "DROP TABLE p_task_limits"


def test_migrate_statements_walk_each_step_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real step 1-2, then a made-up step 2-3 to show that steps chain and reverse."""
    monkeypatch.setitem(
        versions._RELEASES, 3, versions._Release(lambda s, p: [], lambda s, p: [], ())
    )
    monkeypatch.setitem(
        versions._STEPS,
        2,
        versions._Step(
            upgrade=lambda schema, prefix: [f"up 2-3 {schema}.{prefix}"],
            downgrade=lambda schema, prefix: ["down 2-3"],
        ),
    )
    up_1_2 = v1_to_v2.upgrade_statements("s", "p_")
    down_2_1 = v1_to_v2.downgrade_statements("s", "p_")

    assert versions.migrate_statements(1, 2, "s", "p_") == up_1_2
    assert versions.migrate_statements(2, 1, "s", "p_") == down_2_1
    assert versions.migrate_statements(1, 3, "s", "p_") == [*up_1_2, "up 2-3 s.p_"]
    assert versions.migrate_statements(3, 1, "s", "p_") == ["down 2-3", *down_2_1]
    assert versions.migrate_statements(2, 2, "s", "p_") == []
    beyond = versions.LATEST_VERSION + 1
    with pytest.raises(UnknownSchemaVersionError, match=f"version {beyond}"):
        versions.migrate_statements(3, beyond, "s", "p_")
