"""The bare-SQL baseline: the least a Python process must do to run a Postgres queue.

Two flavours, both plain psycopg loops with autocommit (each statement its own
transaction, like sqla_queue's worker loop), one claim statement and one completion
statement per batch, and the handler called in between:

* ``bare`` works on sqla_queue's own tables and does the same durable work: the claim
  marks executions running under a worker id and returns the payload; the completion is
  fenced by (worker, attempt), deletes the executions and writes ``succeeded`` and
  ``finished_at`` into ``jobs``. It leaves out what the baseline does not need to be
  correct for this load: the queue_id head check, the next-due time, per-task leases. It
  is the ceiling the ratios are quoted against.
* ``bare-1tx`` is ``bare`` with the completion of one batch and the claim of the next
  sent together in one transaction through psycopg's pipeline mode: one round trip and
  one commit per batch instead of two. It is not a baseline but a measured lever (see
  ``bench/levers.py``).
* ``bare-min`` is a single narrow table whose completion is a bare DELETE: no job history
  at all. It is the floor of the floor, quoted for reference only (it is the "one claim
  and one delete per batch" loop of the issue's reference figure).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

__all__ = [
    "CLAIM",
    "COMPLETE",
    "ENQUEUE_ONE",
    "ENQUEUE_ONE_NOTIFY",
    "MIN_CLAIM",
    "MIN_COMPLETE",
    "MIN_DDL",
    "drain",
    "listen_and_run",
]

JOBS = "sqla_queue_jobs"
EXECUTIONS = "sqla_queue_job_executions"

CLAIM = f"""
WITH c AS (
    SELECT id FROM {EXECUTIONS}
    WHERE state = 'pending' AND execute_at <= now() AND task = ANY(%(tasks)s)
    ORDER BY priority DESC, execute_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {EXECUTIONS} AS e
SET state = 'running', worker_id = %(worker)s, alive_at = now(), attempt = e.attempt + 1
FROM c, {JOBS} AS j
WHERE e.id = c.id AND j.id = c.id
RETURNING e.id, e.attempt, j.payload
"""

COMPLETE = f"""
WITH o AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS o(id, attempt)
), d AS (
    DELETE FROM {EXECUTIONS} AS e USING o
    WHERE e.id = o.id AND e.attempt = o.attempt
      AND e.worker_id = %(worker)s AND e.state = 'running'
    RETURNING e.id, e.attempt
)
UPDATE {JOBS} AS j SET status = 'succeeded', attempts = d.attempt, finished_at = now()
FROM d WHERE j.id = d.id
"""

_ENQUEUE_HEAD = f"""
WITH j AS (
    INSERT INTO {JOBS} (task, payload, priority, max_attempts, scheduled_at)
    VALUES (%(task)s, %(payload)s, 0, 1, now())
    RETURNING id, task, priority, scheduled_at
)"""

#: One job and its execution in one statement, no wake-up.
ENQUEUE_ONE = f"""{_ENQUEUE_HEAD}
INSERT INTO {EXECUTIONS} (id, task, priority, state, execute_at)
SELECT id, task, priority, 'pending', scheduled_at FROM j
RETURNING id
"""

#: The same, plus one NOTIFY on the channel in ``%(channel)s``.
ENQUEUE_ONE_NOTIFY = f"""{_ENQUEUE_HEAD}, n AS (SELECT pg_notify(%(channel)s, '') AS sent)
INSERT INTO {EXECUTIONS} (id, task, priority, state, execute_at)
SELECT id, task, priority, 'pending', scheduled_at FROM j CROSS JOIN n
RETURNING id
"""

MIN_DDL = """
CREATE TABLE bench_min_queue (
    id bigserial PRIMARY KEY,
    task text NOT NULL,
    payload jsonb NOT NULL,
    priority int NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'pending',
    execute_at timestamptz NOT NULL DEFAULT now(),
    worker_id uuid
) WITH (fillfactor = 70);
CREATE INDEX bench_min_queue_claim_ix ON bench_min_queue (priority DESC, execute_at, id)
    WHERE state = 'pending';
"""

MIN_CLAIM = """
WITH c AS (
    SELECT id FROM bench_min_queue
    WHERE state = 'pending' AND execute_at <= now() AND task = ANY(%(tasks)s)
    ORDER BY priority DESC, execute_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_min_queue AS e SET state = 'running', worker_id = %(worker)s
FROM c WHERE e.id = c.id
RETURNING e.id, e.payload
"""

MIN_COMPLETE = "DELETE FROM bench_min_queue WHERE id = ANY(%(ids)s) AND worker_id = %(worker)s"


def _call(handler: Callable[..., Any], payload: Any) -> None:
    handler(*payload.get("args", ()), **payload.get("kwargs", {}))


def drain(
    dsn: str,
    *,
    flavour: str,
    task: str,
    batch: int,
    handler: Callable[..., Any],
    stop: Callable[[], bool] = lambda: False,
) -> float:
    """Claim, run and complete batches until a claim comes back empty (or ``stop()``).

    ``stop`` is asked between batches, never inside one. Returns the ``time.monotonic()``
    of the last completion.
    """
    worker = uuid.uuid4()
    claim_params: dict[str, Any] = {"tasks": [task], "batch": batch, "worker": worker}
    if flavour == "bare-1tx":
        return _drain_one_transaction(dsn, claim_params, handler)
    last_done = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop():
            if flavour == "bare":
                rows = conn.execute(CLAIM, claim_params).fetchall()
                if not rows:
                    return last_done
                for _id, _attempt, payload in rows:
                    _call(handler, payload)
                conn.execute(
                    COMPLETE,
                    {
                        "ids": [r[0] for r in rows],
                        "attempts": [r[1] for r in rows],
                        "worker": worker,
                    },
                )
            else:
                rows = conn.execute(MIN_CLAIM, claim_params).fetchall()
                if not rows:
                    return last_done
                for _id, payload in rows:
                    _call(handler, payload)
                conn.execute(MIN_COMPLETE, {"ids": [r[0] for r in rows], "worker": worker})
            last_done = time.monotonic()
    return last_done


def _drain_one_transaction(
    dsn: str, claim_params: dict[str, Any], handler: Callable[..., Any]
) -> float:
    last_done = time.monotonic()
    ack: dict[str, Any] | None = None
    with psycopg.connect(dsn) as conn:
        while True:
            with conn.pipeline(), conn.transaction():
                if ack is not None:
                    conn.execute(COMPLETE, ack)
                cur = conn.execute(CLAIM, claim_params)
            rows = cur.fetchall()
            if ack is not None:
                last_done = time.monotonic()
            if not rows:
                return last_done
            for _id, _attempt, payload in rows:
                _call(handler, payload)
            ack = {
                "ids": [r[0] for r in rows],
                "attempts": [r[1] for r in rows],
                "worker": claim_params["worker"],
            }


def listen_and_run(
    dsn: str,
    *,
    channel: str,
    task: str,
    batch: int,
    handler: Callable[..., Any],
    stop: Callable[[], bool],
) -> None:
    """An idle bare worker: LISTEN, and on every notification claim until empty."""
    worker = uuid.uuid4()
    claim_params: dict[str, Any] = {"tasks": [task], "batch": batch, "worker": worker}
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        while not stop():
            while True:
                rows = conn.execute(CLAIM, claim_params).fetchall()
                if not rows:
                    break
                for _id, _attempt, payload in rows:
                    _call(handler, payload)
                conn.execute(
                    COMPLETE,
                    {
                        "ids": [r[0] for r in rows],
                        "attempts": [r[1] for r in rows],
                        "worker": worker,
                    },
                )
            for _ in listener.notifies(timeout=0.5, stop_after=1):
                pass


def payload(**kwargs: Any) -> Jsonb:
    """A job payload in sqla_queue's shape, for the bare enqueue statements."""
    return Jsonb({"args": [], "kwargs": kwargs})
