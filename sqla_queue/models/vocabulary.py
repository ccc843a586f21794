"""The fixed values the queue's tables hold, and the schema version their comment records.

Statuses, states, scopes and history layouts are plain strings in the database, checked by
the tables' ``CHECK`` constraints; each has one class here that names its values and lists
them all. The executions table's comment records the schema version the tables were built
at; it is written and read here only.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_PREFIX",
    "SCHEMA_VERSION",
    "ExecutionState",
    "HistoryLayout",
    "JobStatus",
    "NodeState",
    "ParentFailure",
    "ParentPolicy",
    "StepKind",
    "UniqueScope",
    "check_history",
    "parse_schema_version_comment",
    "schema_version_comment",
]

#: The prefix of every table name of a queue, unless ``Queue(prefix=...)`` says otherwise.
DEFAULT_PREFIX = "sqla_queue_"

#: The schema version that these models describe. Each released version is frozen in
#: ``alembic_ext`` so that an old migration never changes meaning.
SCHEMA_VERSION = 7

_VERSION_COMMENT = "sqla_queue schema version {}"
_VERSION_ANYWHERE = re.compile(r"sqla_queue schema version (\d+)")
_VERSION_EXACT = re.compile(rf"^{_VERSION_ANYWHERE.pattern}$")


class JobStatus:
    """Values of ``jobs.status``. A job is ``queued`` while its execution row exists."""

    QUEUED = "queued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ALL = (QUEUED, SUCCEEDED, FAILED, CANCELLED)
    #: The statuses a job ends in.
    FINAL = (SUCCEEDED, FAILED, CANCELLED)


class HistoryLayout:
    """Where finished jobs live: the values of ``Queue(history=...)``.

    ``plain``: one ``jobs`` table holds every job, and ``prune`` deletes old rows.
    ``partitioned``: ``jobs`` is partitioned by status; the queued jobs live in
    ``jobs_live``, the finished ones in time-range partitions of ``jobs_done`` (succeeded
    and cancelled) and ``jobs_failed``, and ``prune`` drops whole partitions
    (see :mod:`sqla_queue.history`).
    ``none``: the tables of ``plain`` (the same schema: a queue switches between the two
    without a migration), but the completion deletes a succeeded job's row instead of
    recording it, unless someone awaits its result or it holds a unique key (see
    :func:`~sqla_queue.statements.complete_statement`). Failed and cancelled jobs stay.
    """

    PLAIN = "plain"
    PARTITIONED = "partitioned"
    NONE = "none"
    ALL = (PLAIN, PARTITIONED, NONE)


def check_history(history: object) -> str:
    """``history`` if it names a :class:`HistoryLayout`, else a ``ValueError`` listing them."""
    if history not in HistoryLayout.ALL:
        raise ValueError(
            f"history must be one of {', '.join(map(repr, HistoryLayout.ALL))}, got {history!r}"
        )
    return str(history)


class ExecutionState:
    """Values of ``job_executions.state``.

    ``pending`` rows are claimable once due; ``running`` ones are held by a worker. The
    other two exist only for jobs with a ``queue_id`` (schema version 3): ``waiting`` is a
    job queued behind an earlier job of its key, kept out of the claim's indexes until the
    key's turn comes; ``done`` is a finished execution that could not be deleted at once
    because an enqueue in flight holds it as the predecessor of a new waiting job (the next
    maintenance sweep deletes it and promotes the key's next job). ``suspended`` (schema
    version 7) is a durable job that waits (a sleep, a signal, a condition on the app's
    rows): it holds no worker and no seat, its ``wait`` column says what it waits for and
    its ``execute_at`` until when; a signal, a condition's flush or the wake sweep makes it
    ``pending`` again.
    """

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    SUSPENDED = "suspended"
    ALL = (PENDING, RUNNING, WAITING, DONE, SUSPENDED)
    #: Queued, and held by no worker: what a cancel removes at once.
    IDLE = (PENDING, WAITING, SUSPENDED)


class StepKind:
    """Values of ``job_steps.kind`` (schema version 7): what a durable job's checkpoint is.

    ``step``: a step's result, committed with the step's writes. ``cursor``: the position
    of a long loop, moved with each batch's writes. ``wait``: the deadline of a sleep or
    of a wait for a signal or a condition, recorded when the wait began.
    """

    STEP = "step"
    CURSOR = "cursor"
    WAIT = "wait"
    ALL = (STEP, CURSOR, WAIT)


class UniqueScope:
    """Values of ``unique_keys.scope``: how long a job holds its unique key.

    ``queued``: until it starts running; ``active``: until it finishes; ``finished``:
    until ``hold_seconds`` after it finished. A cancelled job gives its key up at once.
    """

    QUEUED = "queued"
    ACTIVE = "active"
    FINISHED = "finished"
    ALL = (QUEUED, ACTIVE, FINISHED)


class NodeState:
    """Values of ``workflow_nodes.state`` (schema version 6): where a workflow's job stands.

    ``blocked``: it waits for its parents, with a job row and no execution (outside every
    index that the claim walks). ``held``: a parent failed and the node waits for an
    operator to requeue that parent (``on_parent_failure="hold"``). ``released``: its
    parents' outcomes let it run; its execution was written when the last one finished.
    ``cancelled``: its parents' outcomes ruled it out, or its workflow was cancelled; its
    job is cancelled and never ran.
    """

    BLOCKED = "blocked"
    HELD = "held"
    RELEASED = "released"
    CANCELLED = "cancelled"
    ALL = (BLOCKED, HELD, RELEASED, CANCELLED)
    #: Still waiting: a requeue or a cancel of the workflow may change them.
    UNDECIDED = (BLOCKED, HELD)


class ParentPolicy:
    """Values of ``workflow_nodes.policy``: what a node needs of its parents to run.

    ``all_succeeded``: every parent succeeded (a failed or cancelled one rules the node
    out at once). ``all_finished``: every parent ended, however. ``quorum``: ``quorum``
    parents succeeded (the node runs as soon as they have).
    """

    ALL_SUCCEEDED = "all_succeeded"
    ALL_FINISHED = "all_finished"
    QUORUM = "quorum"
    ALL = (ALL_SUCCEEDED, ALL_FINISHED, QUORUM)


class ParentFailure:
    """Values of ``workflow_nodes.on_parent_failure``: what a parent's failure does to a node
    that needed it. ``cancel``: the node is cancelled, and its own dependents in turn.
    ``hold``: the node waits until an operator requeues the failed parent."""

    CANCEL = "cancel"
    HOLD = "hold"
    ALL = (CANCEL, HOLD)


def schema_version_comment(version: int) -> str:
    """The table comment that records the schema version on ``job_executions``."""
    return _VERSION_COMMENT.format(version)


def parse_schema_version_comment(comment: str | None, *, anywhere: bool = False) -> int | None:
    """The schema version that a ``job_executions`` table comment records, else ``None``.

    The inverse of :func:`schema_version_comment`. By default the comment must be exactly
    what that function writes (as Alembic's autogenerate sees it on a table it drops);
    ``anywhere=True`` also finds the marker inside a longer comment (as the startup check
    reads it from the catalog).
    """
    pattern = _VERSION_ANYWHERE if anywhere else _VERSION_EXACT
    match = pattern.search(comment or "")
    return int(match.group(1)) if match else None
