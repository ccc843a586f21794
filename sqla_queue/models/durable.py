"""The tables of durable jobs (schema version 7): their committed steps and their signals.

``job_steps`` holds one row per checkpoint of a job: a step's result (written in the
step's own transaction, with the application's writes), a cursor's position, or the
deadline of a wait. Its primary key is what makes a step's writes commit exactly once: a
second attempt that reaches the same step while the first one's transaction is open
waits for it, then finds the row and rolls its own writes back.

``job_signals`` holds the signals sent to jobs, one row per job and name; a job that
waits for a signal finds it there whether it was sent before or after the wait began.

Neither table has a foreign key to ``jobs`` (a partitioned ``jobs`` has no key to refer
to); both are only ever written by this library next to their job, and ``prune``
deletes them with it.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import conv

from sqla_queue.models.vocabulary import StepKind

__all__ = ["job_signals_table", "job_steps_table"]


def job_steps_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The committed checkpoints of durable jobs: steps, cursors and waits."""
    name = f"{prefix}job_steps"
    kinds = ", ".join(f"'{k}'" for k in StepKind.ALL)
    steps = Table(
        name,
        metadata,
        Column("job_id", BigInteger, nullable=False, autoincrement=False),
        Column("name", Text, nullable=False),
        # Commit order across all jobs: a job's steps in the order they committed, which
        # its compensations run in reverse.
        Column("seq", BigInteger, Identity(always=False), nullable=False),
        Column("kind", Text, nullable=False),
        # The code's version of the step when it committed (see the durable jobs guide:
        # a job whose stored version differs waits for an operator).
        Column("version", Integer, nullable=False, server_default=text("1")),
        Column("attempt", Integer, nullable=False),
        # A step's result, a cursor's position, or a wait's deadline (as JSON).
        Column("result", JSONB, nullable=True),
        # The enqueue row of the step's compensation, run if the job finally fails or is
        # cancelled, and the id of that compensation's job once it was enqueued.
        Column("compensate", JSONB, nullable=True),
        Column("compensated_by", BigInteger, nullable=True),
        Column(
            "committed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
        ),
        PrimaryKeyConstraint("job_id", "name", name=conv(f"{name}_pkey")),
        CheckConstraint(f"kind IN ({kinds})", name=conv(f"{name}_kind_ck")),
        schema=schema,
        comment="sqla_queue: committed steps, cursors and waits of durable jobs",
    )
    # The compensation sweep's work list: steps with a compensation not yet enqueued. It
    # holds only the steps of live durable jobs, and of failed ones for a moment.
    Index(
        conv(f"{name}_compensate_ix"),
        steps.c.job_id,
        postgresql_where=steps.c.compensate.is_not(None) & steps.c.compensated_by.is_(None),
    )
    return steps


def job_signals_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The signals sent to jobs: one per job and name, the first one sent."""
    name = f"{prefix}job_signals"
    return Table(
        name,
        metadata,
        Column("job_id", BigInteger, nullable=False, autoincrement=False),
        Column("name", Text, nullable=False),
        Column("payload", JSONB, nullable=True),
        Column("sent_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("job_id", "name", name=conv(f"{name}_pkey")),
        schema=schema,
        comment="sqla_queue: signals sent to durable jobs",
    )
