"""upgrade sqla_queue to schema version 6

The revision `alembic revision --autogenerate` wrote when the host moved to the sqla_queue
release whose models need schema version 6 (workflows). Revisions 0002 to 0006 still
create version 1 and step it to versions 2, 3, 4 and 5: an old migration never changes
meaning.

Revision ID: 0007
Revises: 0006
Create Date: 2027-04-06 10:15:00

"""

from collections.abc import Sequence

from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers this at run time; Alembic's stubs for `op` cannot know it.
    op.upgrade_queue(from_version=5, to_version=6, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]


def downgrade() -> None:
    """Downgrade schema."""
    op.upgrade_queue(from_version=6, to_version=5, schema="work", prefix="sqla_queue_")  # type: ignore[attr-defined]
