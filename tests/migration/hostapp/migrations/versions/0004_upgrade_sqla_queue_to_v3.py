"""upgrade sqla_queue to schema version 3

The revision `alembic revision --autogenerate` wrote when the host moved to the sqla_queue
release whose models need schema version 3 (waiting and done executions for keyed jobs,
three partial indexes for them, and no more foreign key from executions to jobs or indexes
over every task's pending rows). Revisions 0002 and 0003 still create version 1 and step it
to version 2: an old migration never changes meaning.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 22:30:00

"""

from collections.abc import Sequence

from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers this at run time; Alembic's stubs for `op` cannot know it.
    op.upgrade_queue(from_version=2, to_version=3, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]


def downgrade() -> None:
    """Downgrade schema."""
    op.upgrade_queue(from_version=3, to_version=2, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]
