"""Alembic integration of sqla_queue: the queue's tables through the host's own migrations.

Add one line to ``env.py``::

    import alembic_ext  # noqa: F401

Importing the package registers ``op.create_queue``, ``op.drop_queue``,
``op.upgrade_queue``, ``op.partition_history`` and ``op.unpartition_history``, and the
autogenerate hook that renders them. With a ``Queue`` on the ``target_metadata``,
``alembic revision --autogenerate`` then writes ``op.create_queue(schema=..., prefix=...,
version=N)`` instead of ``create_table`` calls, and ``op.upgrade_queue(...)`` once a newer
library needs a newer schema version.
"""

from __future__ import annotations

from alembic_ext._registration import install, is_installed, uninstall
from alembic_ext.ops import (
    CreateQueueOp,
    DropQueueOp,
    PartitionHistoryOp,
    UnpartitionHistoryOp,
    UpgradeQueueOp,
)
from alembic_ext.versions import LATEST_VERSION

__all__ = [
    "LATEST_VERSION",
    "CreateQueueOp",
    "DropQueueOp",
    "PartitionHistoryOp",
    "UnpartitionHistoryOp",
    "UpgradeQueueOp",
    "install",
    "is_installed",
    "uninstall",
]

install()
