"""Fixtures of the unit tier (no database)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import alembic_ext


@pytest.fixture
def clean_alembic() -> Iterator[None]:
    """Alembic without alembic_ext for the test; the previous state is restored after it.

    Registrations are process-wide, so every test that installs them starts and ends clean.
    """
    was_installed = alembic_ext.is_installed()
    alembic_ext.uninstall()
    yield
    alembic_ext.uninstall()
    if was_installed:
        alembic_ext.install()
