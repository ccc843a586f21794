"""upgrade sqla_queue to schema version 7

The revision `alembic revision --autogenerate` wrote when the host moved to the sqla_queue
release whose models need schema version 7 (durable jobs). Revisions 0002 to 0007 still
create version 1 and step it to versions 2, 3, 4, 5 and 6: an old migration never changes
meaning.

Revision ID: 0008
Revises: 0007
Create Date: 2027-05-11 09:40:00

"""

from collections.abc import Sequence

from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers this at run time; Alembic's stubs for `op` cannot know it.
    op.upgrade_queue(from_version=6, to_version=7, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]


def downgrade() -> None:
    """Downgrade schema."""
    op.upgrade_queue(from_version=7, to_version=6, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]
