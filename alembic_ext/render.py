"""How autogenerate writes the queue operations into a migration file."""

from __future__ import annotations

from alembic.autogenerate.api import AutogenContext

from alembic_ext.ops import (
    CreateQueueOp,
    DropQueueOp,
    PartitionHistoryOp,
    QueueOp,
    UnpartitionHistoryOp,
    UpgradeQueueOp,
)

__all__ = [
    "IMPORT_LINE",
    "render_create_queue",
    "render_drop_queue",
    "render_partition_history",
    "render_unpartition_history",
    "render_upgrade_queue",
]

#: Added to the migration's imports: importing ``alembic_ext`` registers ``op.create_queue``
#: and friends, so the migration runs even in an environment whose env.py does not import it.
IMPORT_LINE = "import alembic_ext  # noqa: F401"


def _prefix(autogen_context: AutogenContext) -> str:
    prefix = autogen_context.opts.get("alembic_module_prefix", "op.")
    return prefix if isinstance(prefix, str) else ""


def _where(op: QueueOp) -> str:
    # Both are always written out: a migration must not depend on the library's defaults.
    return f"schema={op.schema!r}, prefix={op.prefix!r}"


def render_create_queue(autogen_context: AutogenContext, op: CreateQueueOp) -> str:
    """``op.create_queue(schema=..., prefix=..., version=N)``."""
    autogen_context.imports.add(IMPORT_LINE)
    history = "" if op.history == "plain" else f", history={op.history!r}"
    return f"{_prefix(autogen_context)}create_queue({_where(op)}, version={op.version!r}{history})"


def render_drop_queue(autogen_context: AutogenContext, op: DropQueueOp) -> str:
    """``op.drop_queue(schema=..., prefix=..., version=N)``."""
    autogen_context.imports.add(IMPORT_LINE)
    history = "" if op.history == "plain" else f", history={op.history!r}"
    return f"{_prefix(autogen_context)}drop_queue({_where(op)}, version={op.version!r}{history})"


def render_upgrade_queue(autogen_context: AutogenContext, op: UpgradeQueueOp) -> str:
    """``op.upgrade_queue(from_version=N, to_version=M, schema=..., prefix=...)``."""
    autogen_context.imports.add(IMPORT_LINE)
    return (
        f"{_prefix(autogen_context)}upgrade_queue(from_version={op.from_version!r}, "
        f"to_version={op.to_version!r}, {_where(op)})"
    )


def render_partition_history(autogen_context: AutogenContext, op: PartitionHistoryOp) -> str:
    """``op.partition_history(schema=..., prefix=..., version=N, interval=...)``."""
    autogen_context.imports.add(IMPORT_LINE)
    return (
        f"{_prefix(autogen_context)}partition_history({_where(op)}, version={op.version!r}, "
        f"interval={op.interval!r})"
    )


def render_unpartition_history(autogen_context: AutogenContext, op: UnpartitionHistoryOp) -> str:
    """``op.unpartition_history(schema=..., prefix=..., version=N)``."""
    autogen_context.imports.add(IMPORT_LINE)
    return f"{_prefix(autogen_context)}unpartition_history({_where(op)}, version={op.version!r})"
