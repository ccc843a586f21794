"""A queue of its own with a one-second periodic schedule, for the periodic tests.

It lives apart from ``tests.support.app``: every worker of a queue runs its schedules, so
registering one on the shared test queue would start a scheduler in every other test.
Its tables use their own prefix in the public schema; a test creates them with
``create_all`` on its fresh database. Worker subprocesses use
``tests.support.periodic_app:queue``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import MetaData

from sqla_queue import Queue

__all__ = ["PREFIX", "queue", "tick"]

PREFIX = "periodic_"

queue = Queue(metadata=MetaData(), prefix=PREFIX, lost_interval=30.0)


@queue.periodic(every=dt.timedelta(seconds=1), name="tick", catch_up="all", catch_up_limit=1000)
def tick() -> None:
    """Does nothing: the tests count the jobs each tick left in the jobs table."""
