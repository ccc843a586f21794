"""Workers: one I/O-free decider (:mod:`.decider`) with a sync face and an asyncio face."""

from sqla_queue.worker.aio import AsyncWorker
from sqla_queue.worker.base import RunStats
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.settings import WorkerSettings
from sqla_queue.worker.sync import Worker

__all__ = [
    "AsyncWorker",
    "JobContext",
    "RunStats",
    "Worker",
    "WorkerSettings",
]
