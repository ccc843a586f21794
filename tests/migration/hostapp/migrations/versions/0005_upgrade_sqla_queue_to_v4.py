"""upgrade sqla_queue to schema version 4

The revision `alembic revision --autogenerate` wrote when the host moved to the sqla_queue
release whose models need schema version 4 (unique keys and their table, cancel requests,
awaited results, jobs linked to application rows). Revisions 0002 to 0004 still create
version 1 and step it to versions 2 and 3: an old migration never changes meaning.

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-12 10:15:00

"""

from collections.abc import Sequence

from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers this at run time; Alembic's stubs for `op` cannot know it.
    op.upgrade_queue(from_version=3, to_version=4, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]


def downgrade() -> None:
    """Downgrade schema."""
    op.upgrade_queue(from_version=4, to_version=3, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]
