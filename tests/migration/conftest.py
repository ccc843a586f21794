"""Fixtures for the migration tier: the sample host project, Alembic configs, catalog snapshots.

The host project (``tests/migration/hostapp``) is copied into a temporary directory for each
test, so generated revisions never touch the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic.config import Config
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from sqla_queue.testing.databases import DatabaseFactory
from tests.migration.catalog import Snapshot, snapshot
from tests.migration.hostapp.models import QUEUE_SCHEMA, queue

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTAPP_MIGRATIONS = Path(__file__).resolve().parent / "hostapp" / "migrations"


@dataclass
class HostProject:
    """A copy of the host app's Alembic project, pointed at one database."""

    root: Path
    url: str

    @property
    def versions(self) -> Path:
        """The directory that holds the revision files."""
        return self.root / "migrations" / "versions"

    @property
    def ini(self) -> Path:
        """The project's ``alembic.ini``."""
        return self.root / "alembic.ini"

    def config(self) -> Config:
        """An Alembic Config for in-process commands (``alembic.command``)."""
        return Config(str(self.ini))

    def revision_files(self) -> list[Path]:
        """The revision files, sorted by name."""
        return sorted(self.versions.glob("*.py"))

    def alembic(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the real ``alembic`` command line in the project directory."""
        return run_cli([sys.executable, "-m", "alembic", *args], self.root, check=check)


def child_env() -> dict[str, str]:
    """The environment for subprocesses: the repository importable, no stray DATABASE_URL."""
    # dict(os.environ) lists the keys, then reads each one; the host-convention cases call
    # this from threads while pytest sets and deletes PYTEST_CURRENT_TEST, so a key can go
    # in between (KeyError seen in a CI matrix cell). Copy again until no key went.
    while True:
        try:
            env = dict(os.environ)
        except KeyError:
            continue
        break
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("DATABASE_URL", None)
    return env


def run_cli(
    argv: list[str],
    cwd: Path,
    *,
    check: bool = True,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command and fail the test with its output if it fails unexpectedly."""
    result = subprocess.run(
        argv,
        input=stdin,
        check=False,
        cwd=cwd,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as ``psql`` understands it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def write_project(
    root: Path, url: str, *, with_history: bool, until: str | None = None
) -> HostProject:
    """Copy the host's Alembic environment (optionally with its committed history).

    ``until`` keeps the history only up to that revision (by file name prefix), as a
    project checked out before the later revisions were written.
    """
    ignore = shutil.ignore_patterns("__pycache__", *(() if with_history else ("*.py",)))
    shutil.copytree(HOSTAPP_MIGRATIONS, root / "migrations", ignore=ignore)
    # copytree skipped every .py above when there is no history; env.py is needed anyway.
    shutil.copy2(HOSTAPP_MIGRATIONS / "env.py", root / "migrations" / "env.py")
    (root / "migrations" / "versions").mkdir(exist_ok=True)
    if until is not None:
        for later in (root / "migrations" / "versions").glob("*.py"):
            if later.name.split("_", 1)[0] > until:
                later.unlink()
    # '%' is configparser's interpolation character.
    escaped = url.replace("%", "%%")
    (root / "alembic.ini").write_text(
        "[alembic]\n"
        "script_location = %(here)s/migrations\n"
        "path_separator = os\n"
        f"sqlalchemy.url = {escaped}\n"
    )
    return HostProject(root=root, url=url)


@pytest.fixture
def host_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host project with no revisions yet, on an empty database."""
    return write_project(tmp_path / "project", empty_db_url, with_history=False)


@pytest.fixture
def history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host project with its committed revision history, on an empty database."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True)


@pytest.fixture
def v1_history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host's history as it was while schema version 1 was the newest (up to 0002)."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True, until="0002")


@pytest.fixture
def v2_history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host's history as it was while schema version 2 was the newest (up to 0003)."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True, until="0003")


@pytest.fixture
def v3_history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host's history as it was while schema version 3 was the newest (up to 0004)."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True, until="0004")


@pytest.fixture
def v4_history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host's history as it was while schema version 4 was the newest (up to 0005)."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True, until="0005")


@pytest.fixture
def v5_history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host's history as it was while schema version 5 was the newest (up to 0006)."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True, until="0006")


@pytest.fixture
def v6_history_project(tmp_path: Path, empty_db_url: str) -> HostProject:
    """The host's history as it was while schema version 6 was the newest (up to 0007)."""
    return write_project(tmp_path / "project", empty_db_url, with_history=True, until="0007")


@pytest.fixture
def new_db(db_factory: DatabaseFactory) -> Iterator[Callable[[], str]]:
    """Make extra empty databases within one test; all are dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(db_factory.clone("template0"))
        return made[-1]

    yield make
    for url in made:
        db_factory.drop(url)


def engine_for(url: str) -> Engine:
    """A pool-less engine, so that dropping the database afterwards never waits."""
    return create_engine(url, poolclass=NullPool)


def schema_snapshot(url: str, schemas: tuple[str, ...] = (QUEUE_SCHEMA,)) -> Snapshot:
    """The catalog snapshot of ``schemas`` in the database at ``url``."""
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            return snapshot(connection, schemas)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def create_all_snapshot(db_factory: DatabaseFactory) -> Snapshot:
    """The host queue's schema as ``queue.create_all`` builds it, snapshotted once."""
    url = db_factory.clone("template0")
    try:
        engine = engine_for(url)
        with engine.begin() as connection:
            queue.create_all(connection)
        engine.dispose()
        return schema_snapshot(url)
    finally:
        db_factory.drop(url)
