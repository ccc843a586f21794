"""A worker of the release that introduced schema version 5, reduced to the SQL it sends.

``claim.sql`` and ``complete.sql`` are that release's claim and completion statements as of
git commit 7b97f22, the last commit whose library needed schema version 5. They were
compiled with the psycopg dialect for schema ``work`` and prefix ``sqla_queue_`` (the host
app's queue, ``tests.migration.hostapp.models.queue`` of that commit) from the builders of
that commit, imported from an export of it (``git archive``):
``statements.claim_statement(queue.tables)`` (the plain claim, which that release ran while
none of a worker's tasks had a concurrency limit or a rate limit) and
``statements.complete_statement(queue.tables)``. The claim renders its ``batch`` bind into
the SQL text when it runs (``__[POSTCOMPILE_batch]`` in the compiled text, three times);
the saved file has ``%(batch)s::INTEGER`` in its place, so ``batch`` is an ordinary
parameter here. The completion binds two constants of its own, ``num_nonnulls_1`` (1) and
``param_1`` (``'work.sqla_queue_finished'``, the channel on which it notifies a caller
awaiting the job's result), which the worker passes as the compiled statement would.
Nothing else was edited.

Unlike version 4's, the claim also returns each execution's ``execute_at`` and
``priority``, and joins the job row by its ``queued`` status; the completion updates only a
queued job. Neither names the ``workflow`` column or the workflow tables of version 6.

Only unkeyed jobs are given to it: after completing a keyed job, that release's worker ran
two more statements (deleting its ``done`` execution and promoting the key's next job),
which this reduction leaves out.

They are frozen text on purpose: today's builders have moved on, and the point is to show
that the SQL of workers still running the previous release keeps working after the step
from version 5 to 6, as the deploy order in docs/guides/alembic.md promises. Never
regenerate them from today's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tests.migration.frozen_worker import LEASE, Claimed, FrozenWorker, read_sql

__all__ = ["LEASE", "Claimed", "V5Worker"]


class V5Worker(FrozenWorker):
    """One version-5 worker process: its id, and the claim and completion it runs."""

    CLAIM_SQL, COMPLETE_SQL = read_sql(__file__)
    COMPLETE_CONSTANTS: ClassVar[Mapping[str, Any]] = {
        "num_nonnulls_1": 1,
        "param_1": "work.sqla_queue_finished",
    }
