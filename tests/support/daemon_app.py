"""A host app with three daemons, for the worker processes of the daemon stress test.

Worker processes import ``tests.support.daemon_app:queue`` (three daemons and a no-op task)
or ``tests.support.daemon_app:plain_queue`` (the same task, no daemon). Both use the test
app's queue tables. Every daemon run records its start, a tick every ``TICK`` seconds and
its stop in ``daemon_ticks``, stamped by the database clock, with its process id and a run
id: the test rebuilds each run's span from them.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    insert,
)

from sqla_queue import Queue
from sqla_queue.daemons import DaemonContext
from tests.support.app import QUEUE_SCHEMA

#: The daemons' lost interval: how soon a killed worker's daemons start elsewhere.
DAEMON_LEASE = 3.0
#: Seconds between two ticks of a daemon.
TICK = 0.1
DAEMON_NAMES = ("ticker_a", "ticker_b", "ticker_c")

ticks_metadata = MetaData()
daemon_ticks = Table(
    "daemon_ticks",
    ticks_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False),
    Column("instance", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("run", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()),
)

queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, lost_interval=30.0)
plain_queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, lost_interval=30.0)


def stress_noop() -> None:
    """An ordinary job that does nothing: the worker's own cost is all that is measured."""


for _queue in (queue, plain_queue):
    _queue.task(name="stress_noop")(stress_noop)


def _record(ctx: DaemonContext, run: str, kind: str) -> None:
    with ctx.session_factory.begin() as session:
        session.execute(
            insert(daemon_ticks).values(
                name=ctx.name, instance=ctx.instance, pid=os.getpid(), run=run, kind=kind
            )
        )


def ticker(ctx: DaemonContext) -> Any:
    """Record a start, a tick every TICK seconds until asked to stop, then a stop."""
    run = uuid.uuid4().hex
    _record(ctx, run, "start")
    while not ctx.wait(TICK):
        _record(ctx, run, "tick")
    _record(ctx, run, "stop")


for _name in DAEMON_NAMES:
    queue.daemon(name=_name, lost_interval=DAEMON_LEASE)(ticker)
