"""add sqla_queue and invoices

The revision `alembic revision --autogenerate` wrote when the host added a Queue (and a
table that refers to its jobs).

Revision ID: 0002
Revises: 0001
Create Date: 2026-02-11 14:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import alembic_ext  # noqa: F401

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # alembic_ext registers these at run time; Alembic's stubs for `op` cannot know them.
    op.create_queue(schema="work", prefix="sqla_queue_", version=1)  # type: ignore[attr-defined]
    op.create_table(
        "invoices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("customer_id", sa.Integer(), nullable=False),
        sa.Column("total", sa.Numeric(precision=12, scale=2), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("mail_job_id", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("total >= 0", name=op.f("ck_invoices_total_positive")),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_invoices_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["mail_job_id"],
            ["work.sqla_queue_jobs.id"],
            name=op.f("fk_invoices_mail_job_id_sqla_queue_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invoices")),
    )
    op.create_index(op.f("ix_invoices_customer_id"), "invoices", ["customer_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_invoices_customer_id"), table_name="invoices")
    op.drop_table("invoices")
    op.drop_queue(schema="work", prefix="sqla_queue_", version=1)  # type: ignore[attr-defined]
