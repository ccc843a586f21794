"""``alembic upgrade head --sql`` prints a complete script: the queue ops need no connection."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest
from alembic import command

from tests.migration.catalog import differences
from tests.migration.conftest import HostProject, libpq_url, run_cli, schema_snapshot
from tests.migration.hostapp.models import QUEUE_SCHEMA

pytestmark = pytest.mark.migration


def test_offline_script_fed_to_psql_builds_the_same_schema_as_an_online_upgrade(
    history_project: HostProject, new_db: Callable[[], str]
) -> None:
    offline = history_project.alembic("upgrade", "head", "--sql")
    script = offline.stdout
    assert "CREATE SCHEMA IF NOT EXISTS work;" in script
    assert "CREATE TABLE work.sqla_queue_jobs (" in script
    assert "CREATE UNIQUE INDEX sqla_queue_job_executions_queue_running_uq" in script
    assert "COMMENT ON TABLE work.sqla_queue_job_executions IS 'sqla_queue schema version 1';" in (
        script
    )

    psql = shutil.which("psql")
    if psql is None:  # pragma: no cover - the CI image has psql
        pytest.skip("psql is not installed")
    target = new_db()
    run_cli(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", libpq_url(target)],
        history_project.root,
        stdin=script,
    )
    command.upgrade(history_project.config(), "head")

    schemas = ("public", QUEUE_SCHEMA)
    assert (
        differences(schema_snapshot(target, schemas), schema_snapshot(history_project.url, schemas))
        == []
    )
