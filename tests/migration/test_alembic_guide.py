"""Follow docs/guides/alembic.md step by step, with the real ``alembic`` and ``sqla-queue``.

The "existing project" the guide starts from is built here: ``alembic init``, a models
module without a queue, and a first revision for the host's own table. Then the guide's
blocks are applied as the guide says: its models file, its ``env.py`` line, its shell
commands. The migration autogenerate writes must be the one the guide shows, at the latest
schema version. Then the section on newer schemas: with the queue created at the previous
version, the guide's autogenerate command must write the ``op.upgrade_queue`` step the guide
shows, and ``alembic check`` must pass after it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from alembic_ext.versions import LATEST_VERSION
from tests.docs.markdown import Block, parse_page
from tests.migration.catalog import queue_objects
from tests.migration.conftest import REPO_ROOT, child_env, engine_for, run_cli

pytestmark = pytest.mark.migration

GUIDE = REPO_ROOT / "docs" / "guides" / "alembic.md"

EXISTING_MODELS = """\
from sqlalchemy import MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention={"pk": "pk_%(table_name)s"})


class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))
"""


def _environment(url: str) -> dict[str, str]:
    env = child_env()
    env["DATABASE_URL"] = url
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _shell(command: str, cwd: Path, url: str) -> str:
    result = run_cli(["bash", "-c", command], cwd, env=_environment(url))
    return result.stdout + result.stderr


def _code(source: str) -> list[str]:
    """The ``alembic_ext`` import and the bodies of upgrade()/downgrade(), line by line."""
    keep = re.compile(r"^(import alembic_ext|def |    op\.|    pass)")
    return [line.rstrip() for line in source.splitlines() if keep.match(line)]


def _one(blocks: list[Block], needle: str, *, without: str = "\0") -> Block:
    [found] = [b for b in blocks if needle in b.source and without not in b.source]
    return found


def test_the_guide_works_as_written(tmp_path: Path, empty_db_url: str) -> None:
    page = parse_page(GUIDE)
    project = tmp_path / "myproject"
    project.mkdir()

    # The existing project: its own models, an Alembic environment, one revision.
    command.init(Config(str(project / "alembic.ini")), str(project / "migrations"))
    ini = project / "alembic.ini"
    # The URL: the guide's env.py lines read it from DATABASE_URL; the ini's placeholder
    # stays as alembic init wrote it, so nothing else can supply it.
    assert "sqlalchemy.url = driver://user:pass@localhost/dbname" in ini.read_text()
    url_lines = _one(page.marked("skip"), "sqlalchemy.url").source
    (project / "myapp").mkdir()
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "models.py").write_text(EXISTING_MODELS)
    env_py = project / "migrations" / "env.py"
    env_py.write_text(
        env_py.read_text()
        .replace(
            "target_metadata = None",
            "from myapp.models import Base\ntarget_metadata = Base.metadata",
        )
        .replace("config = context.config\n", f"config = context.config\n{url_lines}\n", 1)
    )
    assert url_lines in env_py.read_text()
    _shell(
        'alembic revision --autogenerate -m "customers" && alembic upgrade head',
        project,
        empty_db_url,
    )

    # Step 1: the guide's models module, with the Queue.
    [models] = page.marked("file")
    assert models.argument == "myapp/models.py"
    (project / "myapp" / "models.py").write_text(models.source)

    # Step 2: the guide's env.py line, next to the import of the models.
    env_line = _one(page.marked("skip"), "import alembic_ext", without="def ").source.strip()
    assert "\n" not in env_line, "the guide promises one line for env.py"
    source = env_py.read_text()
    env_py.write_text(
        source.replace(
            "from myapp.models import Base", f"{env_line}\nfrom myapp.models import Base"
        )
    )

    # Steps 3 and 4: the guide's commands, in order.
    shells = page.marked("shell")
    assert [b.source.split()[1] for b in shells] == ["revision", "upgrade"]
    generated_before = set((project / "migrations" / "versions").glob("*.py"))
    _shell(shells[0].source, project, empty_db_url)
    [migration] = set((project / "migrations" / "versions").glob("*.py")) - generated_before
    output = _shell(shells[1].source, project, empty_db_url)

    shown = _one(page.marked("skip"), "def upgrade()")
    assert _code(migration.read_text()) == _code(shown.source)
    assert f"version={LATEST_VERSION})" in shown.source
    shown_check = next(b for b in page.blocks if b.language == "text" and "No new" in b.source)
    assert shown_check.source.strip() in output
    assert "schema OK" in output

    engine = engine_for(empty_db_url)
    with engine.connect() as connection:
        assert set(inspect(connection).get_table_names(schema="jobs")) == {
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
        }
    _shell("alembic downgrade -1", project, empty_db_url)
    with engine.connect() as connection:
        assert queue_objects(connection, "sqla_queue_") == []
        assert "customers" in inspect(connection).get_table_names()

    # "When a new release needs a newer schema": the same project, had it added the queue
    # while the previous version was the newest, gets the step shown in the guide from
    # autogenerate.
    latest, previous = LATEST_VERSION, LATEST_VERSION - 1
    written_at_latest = migration.read_text()
    assert written_at_latest.count(f"version={latest})") == 2
    migration.write_text(written_at_latest.replace(f"version={latest})", f"version={previous})"))
    _shell("alembic upgrade head", project, empty_db_url)
    before_step = set((project / "migrations" / "versions").glob("*.py"))
    new_release = _one(page.marked("skip"), 'alembic revision --autogenerate -m "upgrade')
    _shell(new_release.source, project, empty_db_url)
    [step] = set((project / "migrations" / "versions").glob("*.py")) - before_step
    up = f"from_version={previous}, to_version={latest}"
    down = f"from_version={latest}, to_version={previous}"
    step_block = _one(page.marked("skip"), f"op.upgrade_queue({up}, schema=")
    shown_step = step_block.source.strip()
    assert _code(step.read_text()) == [
        "import alembic_ext  # noqa: F401",
        "def upgrade() -> None:",
        f"    {shown_step}",
        "def downgrade() -> None:",
        f"    {shown_step.replace(up, down)}",
    ]
    output = _shell("alembic upgrade head && alembic check", project, empty_db_url)
    assert shown_check.source.strip() in output
    with engine.connect() as connection:
        assert set(inspect(connection).get_table_names(schema="jobs")) == {
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
        }
    engine.dispose()
