"""``alembic upgrade head --sql`` prints a complete script: the queue ops need no connection.

Fed to psql on an empty database, the script builds the same schema as an online
``alembic upgrade head``, and the same queue as ``queue.create_all``: for a project that
creates the latest version at once, and for one whose history creates version 1 and then
steps to 2, to 3, to 4, to 5, to 6 and to 7.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest
from alembic import command

from alembic_ext.versions import LATEST_VERSION
from tests.migration.catalog import Snapshot, differences
from tests.migration.conftest import HostProject, libpq_url, run_cli, schema_snapshot
from tests.migration.hostapp.models import QUEUE_SCHEMA

pytestmark = pytest.mark.migration

QUEUE_TABLES = (
    "sqla_queue_jobs",
    "sqla_queue_job_executions",
    "sqla_queue_task_limits",
    "sqla_queue_unique_keys",
    "sqla_queue_task_controls",
    "sqla_queue_rate_starts",
    "sqla_queue_schedules",
    "sqla_queue_daemons",
    "sqla_queue_workers",
    "sqla_queue_workflows",
    "sqla_queue_workflow_nodes",
    "sqla_queue_workflow_edges",
    "sqla_queue_job_steps",
    "sqla_queue_job_signals",
)


def _run_offline_script(project: HostProject, new_db: Callable[[], str]) -> tuple[str, str]:
    """The ``--sql`` script, and a new database that psql built from it."""
    script = project.alembic("upgrade", "head", "--sql").stdout
    for table in QUEUE_TABLES:
        assert f"CREATE TABLE work.{table} (" in script
    assert "CREATE UNIQUE INDEX sqla_queue_job_executions_slot_uq" in script
    psql = shutil.which("psql")
    if psql is None:  # pragma: no cover - the CI image has psql
        pytest.skip("psql is not installed")
    target = new_db()
    run_cli(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", libpq_url(target)],
        project.root,
        stdin=script,
    )
    return script, target


def _assert_same_schemas(project: HostProject, by_psql: str, create_all_snapshot: Snapshot) -> None:
    command.upgrade(project.config(), "head")
    schemas = ("public", QUEUE_SCHEMA)
    offline = schema_snapshot(by_psql, schemas)
    assert differences(offline, schema_snapshot(project.url, schemas)) == []
    assert {row[1] for row in offline["relations"] if row[2] == "r"} >= set(QUEUE_TABLES)
    assert differences(schema_snapshot(by_psql), create_all_snapshot) == []


def test_offline_script_of_the_history_steps_from_version_1_to_each_later_one_to_7(
    history_project: HostProject, new_db: Callable[[], str], create_all_snapshot: Snapshot
) -> None:
    script, by_psql = _run_offline_script(history_project, new_db)
    assert "CREATE SCHEMA IF NOT EXISTS work;" in script
    assert "CREATE UNIQUE INDEX sqla_queue_job_executions_queue_running_uq" in script
    created_v1 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 1';"
    stepped = "ALTER TABLE work.sqla_queue_job_executions ADD COLUMN slot INTEGER;"
    now_v2 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 2';"
    stepped_again = (
        "ALTER TABLE work.sqla_queue_job_executions "
        "DROP CONSTRAINT sqla_queue_job_executions_job_fk;"
    )
    now_v3 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 3';"
    stepped_to_4 = "ALTER TABLE work.sqla_queue_jobs ADD COLUMN unique_key TEXT,"
    keys_table = "CREATE TABLE work.sqla_queue_unique_keys ("
    now_v4 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 4';"
    controls_table = "CREATE TABLE work.sqla_queue_task_controls ("
    daemons_table = "CREATE TABLE work.sqla_queue_daemons ("
    waiting_index = (
        "CREATE INDEX sqla_queue_job_executions_task_waiting_ix "
        "ON work.sqla_queue_job_executions (task) WHERE state = 'waiting';"
    )
    now_v5 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 5';"
    workflows_table = "CREATE TABLE work.sqla_queue_workflows ("
    stepped_to_6 = (
        "ALTER TABLE work.sqla_queue_job_executions "
        "ADD COLUMN workflow BOOLEAN DEFAULT false NOT NULL;"
    )
    now_v6 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 6';"
    steps_table = "CREATE TABLE work.sqla_queue_job_steps ("
    stepped_to_7 = "ALTER TABLE work.sqla_queue_job_executions ADD COLUMN wait TEXT;"
    suspended_index = (
        "CREATE INDEX sqla_queue_job_executions_suspended_ix "
        "ON work.sqla_queue_job_executions (execute_at) WHERE state = 'suspended';"
    )
    now_v7 = "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 7';"
    # 0002 creates version 1 as released; 0003 then steps it to version 2, 0004 to 3, 0005
    # to 4, 0006 to 5, 0007 to 6 and 0008 to 7.
    assert (
        script.index(created_v1)
        < script.index(stepped)
        < script.index(now_v2)
        < script.index(stepped_again)
        < script.index(now_v3)
        < script.index(stepped_to_4)
        < script.index(keys_table)
        < script.index(now_v4)
        < script.index(controls_table)
        < script.index(daemons_table)
        < script.index(waiting_index)
        < script.index(now_v5)
        < script.index(workflows_table)
        < script.index(stepped_to_6)
        < script.index(now_v6)
        < script.index(steps_table)
        < script.index(stepped_to_7)
        < script.index(suspended_index)
        < script.index(now_v7)
    )
    last_comment = script.rindex("COMMENT ON TABLE work.sqla_queue_job_executions")
    assert last_comment == script.index(now_v7)
    _assert_same_schemas(history_project, by_psql, create_all_snapshot)


def test_offline_script_of_a_fresh_project_creates_the_latest_version(
    host_project: HostProject, new_db: Callable[[], str], create_all_snapshot: Snapshot
) -> None:
    command.revision(host_project.config(), autogenerate=True, message="initial", rev_id="0001")
    script, by_psql = _run_offline_script(host_project, new_db)
    [revision] = host_project.revision_files()
    assert f"op.create_queue(schema='work', prefix='sqla_queue_', version={LATEST_VERSION})" in (
        revision.read_text()
    )
    last_comment = script.rindex("COMMENT ON TABLE work.sqla_queue_job_executions")
    assert script[last_comment:].startswith(
        "COMMENT ON TABLE work.sqla_queue_job_executions IS "
        f"'sqla_queue schema version {LATEST_VERSION}';"
    )
    _assert_same_schemas(host_project, by_psql, create_all_snapshot)
