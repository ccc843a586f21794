"""upgrade sqla_queue to schema version 2

The revision `alembic revision --autogenerate` wrote when the host moved to the sqla_queue
release whose models need schema version 2 (capacity slots and stored concurrency limits).
Revision 0002 still creates version 1: an old migration never changes meaning.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 15:00:00

"""

from collections.abc import Sequence

from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers this at run time; Alembic's stubs for `op` cannot know it.
    op.upgrade_queue(from_version=1, to_version=2, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]


def downgrade() -> None:
    """Downgrade schema."""
    op.upgrade_queue(from_version=2, to_version=1, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]
