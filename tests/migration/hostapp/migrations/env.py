"""The host application's own Alembic environment; the sqla_queue lines are marked."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool

import alembic_ext  # noqa: F401  (sqla_queue) registers op.create_queue and autogenerate
from tests.migration.hostapp.models import QUEUE_SCHEMA, Base

config = context.config
target_metadata = Base.metadata  # the Queue's tables are on it (sqla_queue)

# The host's own filters. Another tool owns `legacy_reports`; only two schemas are managed.
UNMANAGED_TABLES = {"legacy_reports"}
MANAGED_SCHEMAS = {None, QUEUE_SCHEMA}


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only the schemas this app manages."""
    if type_ == "schema":
        return name in MANAGED_SCHEMAS
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Leave tables that another tool owns alone."""
    return not (type_ == "table" and name in UNMANAGED_TABLES)


def _options() -> dict[str, Any]:
    return {
        "target_metadata": target_metadata,
        "include_schemas": True,
        "include_name": include_name,
        "include_object": include_object,
        "compare_type": True,
    }


def run_migrations_offline() -> None:
    """``alembic upgrade --sql``: print the script instead of running it."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **_options(),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against the database."""
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        context.configure(connection=connection, **_options())
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
