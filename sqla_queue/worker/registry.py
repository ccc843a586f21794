"""The worker registry: each worker's row in the workers table, kept fresh by its beats.

Every worker (except a burst run) starts one. Its first beat inserts the worker's row:
host, pid, tasks, handler seats; each beat after it, every few seconds, refreshes
``seen_at`` and the counts (handlers running, jobs finished) and, in the same
transaction, deletes the rows of other workers not seen for :data:`EXPIRE_AFTER` seconds
(a worker killed with SIGKILL never deletes its own). A graceful stop deletes the
worker's own row, after its last job has finished.

Only ``sqla-queue status``, ``top`` and the dashboards read the rows: nothing in the claim
depends on them, so the registry runs on a thread and a connection of its own, and a
database error is logged and the beat retried with backoff; it never stops the worker.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

from sqlalchemy.exc import SQLAlchemyError

from sqla_queue.statements.registry import (
    BeatWorkerParams,
    ExpireWorkersParams,
    UnregisterWorkerParams,
    beat_worker_statement,
    expire_workers_statement,
    unregister_worker_statement,
)
from sqla_queue.worker.services import ServiceEnv
from sqla_queue.worker.threads import WorkerThread, backoff

__all__ = ["BEAT_INTERVAL", "EXPIRE_AFTER", "WorkerRegistry", "finished_jobs"]

log = logging.getLogger("sqla_queue.registry")

#: The longest time, in seconds, between two beats of a worker's row (shorter when the
#: worker's maintenance interval is).
BEAT_INTERVAL = 5.0
#: A row not seen for this many seconds is deleted by the next beat of any live worker.
#: It is at least three beats, so a worker that misses one or two still shows.
EXPIRE_AFTER = 60.0
# The longest backoff between beats after database errors.
_MAX_BACKOFF = 60.0


def finished_jobs(stats: Mapping[str, int]) -> int:
    """Jobs a worker finished: attempts that ended its job (succeeded, failed, cancelled).

    An attempt that failed and was scheduled to retry did not finish its job.
    """
    return sum(int(stats.get(key, 0)) for key in ("succeeded", "failed", "cancelled"))


class WorkerRegistry(WorkerThread):
    """A worker service (a :class:`~sqla_queue.worker.threads.WorkerThread`) keeping the
    worker's row.

    ``beat()`` writes the row once (and expires stale rows); the thread started by
    ``start()`` beats every ``beat_interval`` seconds until ``request_stop()``, then deletes
    the row. The worker's stop flag alone does not end it: while a graceful stop waits for
    running handlers, the row goes on showing them.
    """

    thread_name = "sqla-queue-registry"

    def __init__(
        self,
        env: ServiceEnv,
        *,
        beat_interval: float | None = None,
        expire_after: float = EXPIRE_AFTER,
    ) -> None:
        self.env = env
        interval = min(env.maintenance_interval, BEAT_INTERVAL)
        self.beat_interval = float(beat_interval if beat_interval is not None else interval)
        self.expire_after = max(float(expire_after), 3.0 * self.beat_interval)
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        #: Beats written, and beats that failed (logged, then retried).
        self.beats = 0
        self.failures = 0
        self._failures_in_row = 0
        super().__init__()
        tables = env.tables
        self._beat = beat_worker_statement(tables)
        self._expire = expire_workers_statement(tables)
        self._unregister = unregister_worker_statement(tables)

    # -- one beat -----------------------------------------------------------------------

    def beat(self) -> None:
        """Insert or refresh the worker's row and delete expired rows, in one transaction.

        Raises what the database raises (the loop logs it and tries again).
        """
        env = self.env
        running = env.running_count() if env.running_count is not None else 0
        stats = env.worker_stats() if env.worker_stats is not None else {}
        row: BeatWorkerParams = {
            "worker_id": env.worker_id,
            "hostname": self.hostname,
            "pid": self.pid,
            "tasks": list(env.tasks),
            "concurrency": env.concurrency,
            "running": running,
            "finished": finished_jobs(stats),
        }
        expire: ExpireWorkersParams = {
            "worker_id": env.worker_id,
            "expire_after": self.expire_after,
        }
        with env.engine.begin() as connection:
            connection.execute(self._beat, row)
            connection.execute(self._expire, expire)
        self.beats += 1

    def unregister(self) -> None:
        """Delete the worker's own row. Raises what the database raises."""
        params: UnregisterWorkerParams = {"worker_id": self.env.worker_id}
        with self.env.engine.begin() as connection:
            connection.execute(self._unregister, params)

    # -- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        """Beat until :meth:`request_stop`, then delete the worker's row."""
        self.repeat(self._step)
        try:
            self.unregister()
        except Exception as exc:
            # The row expires on its own once other workers' beats see it stale.
            log.warning("could not delete this worker's registry row (%s); it will expire", exc)

    def _step(self) -> float:
        """One beat; the seconds until the next (longer after failures in a row)."""
        try:
            self.beat()
        except SQLAlchemyError as exc:
            wait = self._failed()
            log.warning("worker registry beat failed (%s); retrying in %.1f s", exc, wait)
        except Exception:
            # A bug here must not end the worker: the registry only informs operators.
            wait = self._failed()
            log.exception("worker registry beat failed; retrying in %.1f s", wait)
        else:
            self._failures_in_row = 0
            wait = self.beat_interval
        return wait

    def _failed(self) -> float:
        self._failures_in_row += 1
        self.failures += 1
        return backoff(self.beat_interval, self._failures_in_row, cap=_MAX_BACKOFF)
