"""A worker of an earlier release, reduced to the frozen SQL it sends (claim and completion).

Each release's package (``v1_worker`` to ``v6_worker``) holds that release's statements as
copied text and subclasses :class:`FrozenWorker` with them; only the SQL differs between
releases, and the parameters they take are the same but for the constants
that a release's compiled text binds (its ``COMPLETE_CONSTANTS``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Connection

__all__ = ["LEASE", "Claimed", "FrozenWorker", "read_sql"]

#: The lease a worker of these releases gave its executions by default, in seconds.
LEASE = 30.0


def read_sql(package_file: str) -> tuple[str, str]:
    """``claim.sql`` and ``complete.sql`` beside ``package_file``."""
    here = Path(package_file).resolve().parent
    return (here / "claim.sql").read_text(), (here / "complete.sql").read_text()


@dataclass(frozen=True)
class Claimed:
    """One execution an old worker claimed."""

    id: int
    attempt: int
    task: str
    queue_id: str | None


@dataclass
class FrozenWorker:
    """One old worker process: its id, and the claim and completion its release runs."""

    CLAIM_SQL: ClassVar[str]
    COMPLETE_SQL: ClassVar[str]
    #: Constants that the release's completion binds beyond the shared ones (SQLAlchemy
    #: turns a literal in the builder into a bound parameter with the literal as its value).
    COMPLETE_CONSTANTS: ClassVar[Mapping[str, Any]] = {}

    worker_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def claim(self, connection: Connection, tasks: Sequence[str], batch: int) -> list[Claimed]:
        """Claim up to ``batch`` due executions of ``tasks``, as that release did."""
        rows = connection.exec_driver_sql(
            self.CLAIM_SQL,
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
            self.COMPLETE_SQL,
            {
                "outcomes": json.dumps(outcomes),
                "worker": self.worker_id,
                "coalesce_1": 0.0,
                "attempt_1": 1,
                **self.COMPLETE_CONSTANTS,
            },
        ).all()
        return sorted(int(r[0]) for r in rows)
