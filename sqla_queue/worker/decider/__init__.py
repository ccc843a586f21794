"""The worker's decider: every decision of a worker, without I/O, in parts.

:class:`Decider` (:mod:`.decider`) composes the parts, one module each; the sync and the
asyncio faces ask it what to do next and report back.
"""

from sqla_queue.worker.decider.decider import Clock, Decider, intervals, utcnow
from sqla_queue.worker.decider.intake import ContextFactory

__all__ = ["Clock", "ContextFactory", "Decider", "intervals", "utcnow"]
