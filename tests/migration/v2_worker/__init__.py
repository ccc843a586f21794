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

from tests.migration.frozen_worker import LEASE, Claimed, FrozenWorker, read_sql

__all__ = ["LEASE", "Claimed", "V2Worker"]


class V2Worker(FrozenWorker):
    """One version-2 worker process: its id, and the claim and completion it runs."""

    CLAIM_SQL, COMPLETE_SQL = read_sql(__file__)
