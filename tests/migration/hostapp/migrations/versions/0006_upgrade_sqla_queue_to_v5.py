"""upgrade sqla_queue to schema version 5

The revision `alembic revision --autogenerate` wrote when the host moved to the sqla_queue
release whose models need schema version 5 (task pause and rate limits, periodic
schedules, daemons). Revisions 0002 to 0005 still create version 1 and step it to versions
2, 3 and 4: an old migration never changes meaning.

Revision ID: 0006
Revises: 0005
Create Date: 2027-03-02 09:40:00

"""

from collections.abc import Sequence

from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers this at run time; Alembic's stubs for `op` cannot know it.
    op.upgrade_queue(from_version=4, to_version=5, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]


def downgrade() -> None:
    """Downgrade schema."""
    op.upgrade_queue(from_version=5, to_version=4, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]
