"""A worker of the release that introduced schema version 1, reduced to the SQL it sends.

``claim.sql`` and ``complete.sql`` are that release's claim and completion statements,
compiled with the psycopg dialect for schema ``work`` and prefix ``sqla_queue_`` (the host
app's queue) from the statement builders as they were when version 1 was frozen. They are
copied text on purpose: today's builders have moved on, and the point is to show that the
SQL of workers still running the previous release keeps working after the upgrade, as the
deploy order in docs/guides/alembic.md promises. Never regenerate them from today's code.
"""

from __future__ import annotations

from tests.migration.frozen_worker import LEASE, Claimed, FrozenWorker, read_sql

__all__ = ["LEASE", "Claimed", "V1Worker"]


class V1Worker(FrozenWorker):
    """One version-1 worker process: its id, and the claim and completion it runs."""

    CLAIM_SQL, COMPLETE_SQL = read_sql(__file__)
