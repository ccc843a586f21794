"""Planner settings for the worker's own transactions: the guard behind every hot statement.

A queue's statistics are usually wrong exactly when it matters. Autovacuum analyzes the
executions table while it is nearly empty; a burst then arrives well inside autovacuum's
naptime, and the planner, believing the pending set tiny, sorts the whole backlog instead of
walking an index in claim order (measured: 140 ms per claim at 300,000 pending, against
0.3 ms for the walk). Every hot statement is shaped so that an ordered index walk bounded by
the batch is its natural plan; this guard removes the alternatives that only look cheaper
under stale statistics: sequential scans, bitmap scans (which return rows out of order), and
explicit sorts (every hot statement can be served in index order; the few sorts left are of a
batch of rows and cost the same under the guard).

The settings are ``SET LOCAL``: they last for the worker's transaction and never leak into
the application's sessions, and they work behind a pooler in transaction mode, where a
session setting would land on somebody else's connection. They are sent in the same round
trip as the statements they guard.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text

__all__ = ["GUARDED_SETTINGS", "IDLE_IN_TRANSACTION", "planner_guard"]

#: Longest idle time inside one of the worker's own transactions before the server ends
#: the session (and releases its locks).
IDLE_IN_TRANSACTION = "10s"

#: The settings the guard applies, as (name, value); see the module docstring.
GUARDED_SETTINGS: tuple[tuple[str, str], ...] = (
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_sort", "off"),
    # Plans estimated from stale statistics can cross jit_above_cost; compiling a claim
    # takes longer than running it.
    ("jit", "off"),
    # Not a planner setting, but a transaction's: a worker cut off from the server in the
    # middle of one (a network partition between two round trips) leaves its rows locked,
    # and the reclaim sweep skips locked rows, until the server notices the lost client
    # (two hours with default TCP keepalives). The worker's own transactions are never
    # idle for more than a moment, so the server may end one that is.
    ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION),
)

_GENERIC = (("plan_cache_mode", "force_generic_plan"),)


def planner_guard(*, generic_plans: bool = True) -> TextClause:
    """The statement that opens every worker transaction: ``SET LOCAL`` of the guard.

    With ``generic_plans``, prepared statements also get one generic plan each instead of
    being planned at every run (see ``WorkerSettings.generic_plans``). It is one statement
    (``set_config(..., true)`` is ``SET LOCAL``), so the guard costs no extra round trip in a
    pipeline and one short statement otherwise.
    """
    settings = GUARDED_SETTINGS + (_GENERIC if generic_plans else ())
    # Each column named after its setting: a row of five columns all called set_config is
    # not a valid named tuple.
    calls = ", ".join(
        f"set_config('{name}', '{value}', true) AS {name}" for name, value in settings
    )
    return text(f"SELECT {calls}")
