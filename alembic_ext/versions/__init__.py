"""Every released queue schema version, frozen as SQL text, and the steps between them.

A migration names a version (``op.create_queue(..., version=1)``) and gets that version's
frozen statements, whatever the library's models look like today. Releasing version ``N``
means adding ``vN.py`` (create, drop, and the list of its tables) and ``v{N-1}_to_vN.py``
(upgrade and downgrade), registering both below, and bumping ``SCHEMA_VERSION`` in
``sqla_queue.models.tables``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alembic_ext.versions import (
    v1,
    v1_to_v2,
    v2,
    v2_to_v3,
    v3,
    v3_to_v4,
    v4,
    v4_to_v5,
    v5,
    v5_to_v6,
    v6,
    v6_to_v7,
    v7,
)

__all__ = [
    "LATEST_VERSION",
    "UnknownSchemaVersionError",
    "create_statements",
    "drop_statements",
    "known_versions",
    "migrate_statements",
    "table_suffixes",
]

Statements = Callable[[str | None, str], list[str]]


@dataclass(frozen=True)
class _Release:
    create: Statements
    drop: Statements
    tables: tuple[str, ...]


@dataclass(frozen=True)
class _Step:
    upgrade: Statements
    downgrade: Statements


_RELEASES: dict[int, _Release] = {
    v1.VERSION: _Release(v1.create_statements, v1.drop_statements, v1.TABLES),
    v2.VERSION: _Release(v2.create_statements, v2.drop_statements, v2.TABLES),
    v3.VERSION: _Release(v3.create_statements, v3.drop_statements, v3.TABLES),
    v4.VERSION: _Release(v4.create_statements, v4.drop_statements, v4.TABLES),
    v5.VERSION: _Release(v5.create_statements, v5.drop_statements, v5.TABLES),
    v6.VERSION: _Release(v6.create_statements, v6.drop_statements, v6.TABLES),
    v7.VERSION: _Release(v7.create_statements, v7.drop_statements, v7.TABLES),
}
# _STEPS[n] goes from version n to n + 1.
_STEPS: dict[int, _Step] = {
    v1_to_v2.FROM_VERSION: _Step(v1_to_v2.upgrade_statements, v1_to_v2.downgrade_statements),
    v2_to_v3.FROM_VERSION: _Step(v2_to_v3.upgrade_statements, v2_to_v3.downgrade_statements),
    v3_to_v4.FROM_VERSION: _Step(v3_to_v4.upgrade_statements, v3_to_v4.downgrade_statements),
    v4_to_v5.FROM_VERSION: _Step(v4_to_v5.upgrade_statements, v4_to_v5.downgrade_statements),
    v5_to_v6.FROM_VERSION: _Step(v5_to_v6.upgrade_statements, v5_to_v6.downgrade_statements),
    v6_to_v7.FROM_VERSION: _Step(v6_to_v7.upgrade_statements, v6_to_v7.downgrade_statements),
}

LATEST_VERSION = max(_RELEASES)


class UnknownSchemaVersionError(ValueError):
    """A migration or model names a queue schema version this library does not know."""


def known_versions() -> tuple[int, ...]:
    """The released schema versions, oldest first."""
    return tuple(sorted(_RELEASES))


def _release(version: int) -> _Release:
    try:
        return _RELEASES[version]
    except KeyError:
        raise UnknownSchemaVersionError(
            f"sqla_queue schema version {version!r} is unknown to this library (known: "
            f"{', '.join(map(str, known_versions()))}); upgrade sqla_queue to run this migration"
        ) from None


def create_statements(version: int, schema: str | None, prefix: str) -> list[str]:
    """The frozen statements that create schema ``version``."""
    return _release(version).create(schema, prefix)


def drop_statements(version: int, schema: str | None, prefix: str) -> list[str]:
    """The frozen statements that drop schema ``version``."""
    return _release(version).drop(schema, prefix)


def table_suffixes(version: int) -> tuple[str, ...]:
    """The tables that schema ``version`` has, each named by what follows the prefix.

    ``drop_queue`` at that version drops exactly these, so autogenerate may only replace
    Alembic's ``drop_table`` calls by one ``drop_queue`` when all of them are going away.
    """
    return _release(version).tables


def migrate_statements(
    from_version: int, to_version: int, schema: str | None, prefix: str
) -> list[str]:
    """The statements that take an install from one version to another, in either direction.

    Each step also rewrites the version comment on the executions table, so the database
    always says which version it holds.
    """
    _release(from_version)
    _release(to_version)
    statements: list[str] = []
    if from_version <= to_version:
        for version in range(from_version, to_version):
            statements += _step(version).upgrade(schema, prefix)
    else:
        for version in range(from_version - 1, to_version - 1, -1):
            statements += _step(version).downgrade(schema, prefix)
    return statements


def _step(version: int) -> _Step:
    try:
        return _STEPS[version]
    except KeyError:
        raise UnknownSchemaVersionError(
            f"no step between sqla_queue schema versions {version} and {version + 1}"
        ) from None
