"""A worker of the release that introduced schema version 2, reduced to the SQL it sends.

``claim.sql`` and ``complete.sql`` are that release's claim and completion statements as of
git commit 5f7a6b3, the last commit whose library needed schema version 2. They were
compiled with the psycopg dialect for schema ``work`` and prefix ``sqla_queue_`` (the host
app's queue, ``tests.migration.hostapp.models.queue`` of that commit) from the builders of
that commit, imported from a worktree of it: ``statements.claim_statement(queue.tables)``
(the plain claim, which that release ran while none of a worker's tasks had a concurrency
limit) and ``statements.complete_statement(queue.tables)``. The claim renders its ``batch``
bind into the SQL text when it runs (``__[POSTCOMPILE_batch]`` in the compiled text); the
saved file has ``%(batch)s::INTEGER`` in its place, so ``batch`` is an ordinary parameter
here. Nothing else was edited.

They are frozen text on purpose: today's builders have moved on, and the point is to show
that the SQL of workers still running the previous release keeps working after the step
from version 2 to 3, as the deploy order in docs/guides/alembic.md promises. Never
regenerate them from today's code.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

_HERE = Path(__file__).resolve().parent
CLAIM_SQL = (_HERE / "claim.sql").read_text()
COMPLETE_SQL = (_HERE / "complete.sql").read_text()

#: The lease a version-2 worker gave its executions by default (``Queue.lost_interval``).
LEASE = 30.0


@dataclass(frozen=True)
class Claimed:
    """One execution a version-2 worker claimed."""

    id: int
    attempt: int
    task: str
    queue_id: str | None


@dataclass
class V2Worker:
    """One version-2 worker process: its id, and the claim and completion it runs."""

    worker_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def claim(self, connection: Connection, tasks: Sequence[str], batch: int) -> list[Claimed]:
        """Claim up to ``batch`` due executions of ``tasks``, as the version-2 worker did."""
        rows = connection.exec_driver_sql(
            CLAIM_SQL,
            {
                "tasks": sorted(tasks),
                "batch": batch,
                "attempt_1": 1,
                "worker": self.worker_id,
                "lease_map": "{}",
                "lease": LEASE,
            },
        ).all()
        return [Claimed(r.id, r.attempt, r.task, r.queue_id) for r in rows if r.id is not None]

    def succeed(self, connection: Connection, claimed: Sequence[Claimed], result: Any) -> list[int]:
        """Report ``claimed`` as succeeded; returns the ids the fenced completion applied to."""
        outcomes = [
            {
                "id": c.id,
                "attempt": c.attempt,
                "kind": "succeeded",
                "result": result,
                "error": None,
                "execute_at": None,
                "delay": None,
            }
            for c in claimed
        ]
        rows = connection.exec_driver_sql(
            COMPLETE_SQL,
            {
                "outcomes": json.dumps(outcomes),
                "worker": self.worker_id,
                "coalesce_1": 0.0,
                "attempt_1": 1,
            },
        ).all()
        return sorted(int(r[0]) for r in rows)
