"""A worker of the release that introduced schema version 6, reduced to the SQL it sends.

``claim.sql`` and ``complete.sql`` are that release's claim and completion statements as of
git commit e0cae92, the last commit whose library needed schema version 6. They were
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

Unlike version 5's, the claim also returns each execution's ``workflow`` mark, and the
completion carries it from the executions it applied to (that release's worker then
released a finished node's dependents in a statement of its own, which this reduction
leaves out: only plain jobs are given to it). Neither names the ``wait`` column, the
``suspended`` state or the durable job tables of version 7: the claim takes only
``pending`` executions and the completion only ``running`` ones.

Only unkeyed jobs are given to it: after completing a keyed job, that release's worker ran
two more statements (deleting its ``done`` execution and promoting the key's next job),
which this reduction leaves out.

They are frozen text on purpose: today's builders have moved on, and the point is to show
that the SQL of workers still running the previous release keeps working after the step
from version 6 to 7, as the deploy order in docs/guides/alembic.md promises. Never
regenerate them from today's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tests.migration.frozen_worker import LEASE, Claimed, FrozenWorker, read_sql

__all__ = ["LEASE", "Claimed", "V6Worker"]


class V6Worker(FrozenWorker):
    """One version-6 worker process: its id, and the claim and completion it runs."""

    CLAIM_SQL, COMPLETE_SQL = read_sql(__file__)
    COMPLETE_CONSTANTS: ClassVar[Mapping[str, Any]] = {
        "num_nonnulls_1": 1,
        "param_1": "work.sqla_queue_finished",
    }
