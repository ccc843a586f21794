"""The queue's links to the application's rows: the jobs and workflows about a row.

A mixin of :class:`~sqla_queue.Queue`; each method hands the call on to
:mod:`sqla_queue.links` with the queue's mapped classes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Relationship

from sqla_queue import links
from sqla_queue.models.mapped import Job, WorkflowRecord

__all__ = ["RowLinks"]


class RowLinks:
    """Jobs and workflows linked to the application's rows (``about=...``)."""

    Job: type[Job]
    WorkflowRecord: type[WorkflowRecord]

    def jobs_about(self, about: object) -> Select[Any]:
        """``select(queue.Job)`` of the jobs about ``about``. See :mod:`sqla_queue.links`."""
        return links.jobs_about(self.Job, about)

    def about_relationship(self, mapped: type, **kwargs: Any) -> Relationship[Any]:
        """A ``relationship()`` from ``mapped`` to its jobs. See :mod:`sqla_queue.links`."""
        return links.about_relationship(self.Job, mapped, **kwargs)

    def workflows_about(self, about: object) -> Select[Any]:
        """``select(queue.WorkflowRecord)`` of the workflows about ``about``."""
        return links.jobs_about(self.WorkflowRecord, about)

    def workflows_relationship(self, mapped: type, **kwargs: Any) -> Relationship[Any]:
        """A read-only ``relationship()`` from ``mapped`` to its workflows:
        ``Order.workflows = queue.workflows_relationship(Order)``."""
        return links.about_relationship(self.WorkflowRecord, mapped, **kwargs)
