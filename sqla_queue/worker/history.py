"""The history service: a worker creates the partitions of finished jobs ahead of time.

Started by every worker (not by burst runs) of a queue with ``history="partitioned"``. At
start and then every :data:`MAINTAIN_INTERVAL` seconds it runs
:func:`sqla_queue.history.maintain_history` in a short transaction of its own, so the
partitions of the current interval and the next few exist before any job finishes in them.
Many workers doing it at once is harmless: each creates only what is missing, under the
default partition's lock, and a lost race is an error logged and retried later.

Creating partitions needs ownership of the jobs table. A worker whose role lacks it (the
least-privilege setup) logs once and stops the service; ``sqla-queue maintain``, run by the
migration role from cron or a deploy step, then does it instead. A finished job no
partition covers is never lost: it waits in the default partition, and the next
maintenance moves it.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.history import DEFAULT_AHEAD, maintain_history
from sqla_queue.history.partitions import MaintainReport
from sqla_queue.worker.services import ServiceEnv
from sqla_queue.worker.threads import WorkerThread

__all__ = ["MAINTAIN_INTERVAL", "HistoryMaintainer"]

log = logging.getLogger("sqla_queue.history")

#: Seconds between two maintenance runs of one worker.
MAINTAIN_INTERVAL = 600.0


class HistoryMaintainer(WorkerThread):
    """A worker service (a :class:`~sqla_queue.worker.threads.WorkerThread`) creating
    history partitions: at start, then every ``interval`` seconds until
    ``request_stop()`` or the worker's stop flag."""

    thread_name = "sqla-queue-history"

    def __init__(self, env: ServiceEnv, *, interval: float = MAINTAIN_INTERVAL) -> None:
        self.env = env
        self.interval = interval
        super().__init__(stop_flag=env.stop_flag)
        #: The report of the last successful run, for tests and status pages.
        self.last_report: MaintainReport | None = None

    def run_once(self) -> bool:
        """One maintenance run; ``False`` when the role may not create partitions."""
        try:
            with self.env.engine.begin() as connection:
                report = maintain_history(connection, self.env.tables, ahead=DEFAULT_AHEAD)
        except SQLAlchemyError as exc:
            if sqlstate_of(exc) == INSUFFICIENT_PRIVILEGE:
                log.warning(
                    "this worker's role may not create history partitions (%s); run "
                    "`sqla-queue maintain` as the jobs table's owner instead",
                    exc.__cause__ or exc,
                )
                return False
            log.warning("history maintenance failed, retrying later: %s", exc)
            return True
        self.last_report = report
        if report.created:
            log.info(
                "created %d history partition(s), moved %d job(s) into them",
                len(report.created),
                report.moved,
            )
        return True

    def _run(self) -> None:
        """Maintain until stopped, or until the role turns out not to be allowed to."""
        self.repeat(self._step)

    def _step(self) -> float | None:
        return self.interval if self.run_once() else None
