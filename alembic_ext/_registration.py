"""Registering the operations, their implementations, renderers and the comparator with Alembic.

Alembic keeps all of these in process-wide registries. :func:`install` is idempotent, and
:func:`uninstall` takes everything out again so that tests can start from a clean Alembic.

The comparator hooks go into Alembic's global comparator dispatch, which every autogenerate
run uses. On Alembic 1.18+ one runs at ``DispatchPriority.FIRST`` (it hides the queue's
tables from Alembic's own comparison) and one at ``DispatchPriority.LAST`` (it writes the
queue operations); older releases run comparators in registration order, so there the one
hook sits at the ``"schema"`` level after Alembic's table comparison.
It is deliberately not an ``alembic.plugins`` entry point: Alembic runs a plugin's
comparators only in environments that list the plugin in ``autogenerate_plugins`` (anywhere
else the queue's tables would silently come out as ``create_table``), and it loads entry
points while ``alembic.autogenerate`` is still being imported, before the registries this
module fills exist.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from alembic.autogenerate import comparators, renderers
from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation, Operations
from alembic.operations.ops import UpgradeOps

from alembic_ext.compare import compare_queues, hide_queue_tables
from alembic_ext.ops import (
    CreateQueueOp,
    DropQueueOp,
    PartitionHistoryOp,
    UnpartitionHistoryOp,
    UpgradeQueueOp,
    run_create_queue,
    run_drop_queue,
    run_partition_history,
    run_unpartition_history,
    run_upgrade_queue,
)
from alembic_ext.render import (
    render_create_queue,
    render_drop_queue,
    render_partition_history,
    render_unpartition_history,
    render_upgrade_queue,
)

__all__ = ["install", "is_installed", "uninstall"]

_OPERATIONS: tuple[
    tuple[str, type[MigrateOperation], Callable[..., Any], Callable[..., str]], ...
] = (
    ("create_queue", CreateQueueOp, run_create_queue, render_create_queue),
    ("drop_queue", DropQueueOp, run_drop_queue, render_drop_queue),
    ("upgrade_queue", UpgradeQueueOp, run_upgrade_queue, render_upgrade_queue),
    ("partition_history", PartitionHistoryOp, run_partition_history, render_partition_history),
    (
        "unpartition_history",
        UnpartitionHistoryOp,
        run_unpartition_history,
        render_unpartition_history,
    ),
)


class _State:
    lock = threading.Lock()
    installed = False


_state = _State()


def _has_priority_dispatch() -> bool:
    # Alembic 1.18 replaced the "schema" list dispatch with priorities and an "autogenerate"
    # level; before it, comparators simply ran in registration order.
    from alembic import util

    return hasattr(util, "DispatchPriority")


def _before_alembic(autogen_context: AutogenContext, upgrade_ops: UpgradeOps) -> Any:
    from alembic.util import PriorityDispatchResult  # type: ignore[attr-defined,unused-ignore]

    hide_queue_tables(autogen_context, upgrade_ops)
    return PriorityDispatchResult.CONTINUE


def _after_alembic(autogen_context: AutogenContext, upgrade_ops: UpgradeOps) -> Any:
    from alembic.util import PriorityDispatchResult  # type: ignore[attr-defined,unused-ignore]

    compare_queues(autogen_context, upgrade_ops)
    return PriorityDispatchResult.CONTINUE


def _before_alembic_tables(
    autogen_context: AutogenContext, upgrade_ops: UpgradeOps, schemas: Any
) -> None:
    hide_queue_tables(autogen_context, upgrade_ops)


def _after_alembic_tables(
    autogen_context: AutogenContext, upgrade_ops: UpgradeOps, schemas: Any
) -> None:
    compare_queues(autogen_context, upgrade_ops)


def _hook_slots() -> list[tuple[tuple[Any, ...], Callable[..., Any]]]:
    """Where in the global comparator registry each hook goes: (registry key, hook)."""
    if _has_priority_dispatch():
        from alembic.util import DispatchPriority  # type: ignore[attr-defined,unused-ignore]

        return [
            (("autogenerate", "default", DispatchPriority.FIRST), _before_alembic),
            (("autogenerate", "default", DispatchPriority.LAST), _after_alembic),
        ]
    # Older Alembic runs the "schema" comparators in list order; its own table comparison
    # was registered first. _register_hooks puts the first hook in front of it.
    return [
        (("schema", "default"), _before_alembic_tables),
        (("schema", "default"), _after_alembic_tables),
    ]


def _is_hook(entry: Any, hook: Callable[..., Any]) -> bool:
    # Alembic 1.18+ stores (function, subgroup) pairs; older releases store functions.
    return entry is hook or (isinstance(entry, tuple) and bool(entry) and entry[0] is hook)


def _register_hooks() -> None:
    for key, hook in _hook_slots():
        entries = comparators._registry.get(key, [])
        if isinstance(entries, list) and any(_is_hook(entry, hook) for entry in entries):
            continue
        if len(key) == 3:
            comparators.dispatch_for(key[0], priority=key[2])(hook)  # type: ignore[call-arg,unused-ignore]
        else:
            comparators.dispatch_for(key[0])(hook)
            if hook is _before_alembic_tables:
                entries = comparators._registry[key]
                entries.insert(0, entries.pop())


def install() -> None:
    """Register ``op.create_queue``/``drop_queue``/``upgrade_queue`` and the autogenerate hooks.

    Called when ``alembic_ext`` is imported; calling it again does nothing.
    """
    with _state.lock:
        if _state.installed:
            return
        for name, op_class, implementation, renderer in _OPERATIONS:
            if not hasattr(Operations, name):
                Operations.register_operation(name)(op_class)
            if (op_class, "default") not in Operations._to_impl._registry:
                Operations.implementation_for(op_class)(implementation)
            if (op_class, "default") not in renderers._registry:
                renderers.dispatch_for(op_class)(renderer)
        _register_hooks()
        _state.installed = True


def uninstall() -> None:
    """Remove everything :func:`install` registered (for tests; Alembic has no public API)."""
    with _state.lock:
        for name, op_class, _implementation, _renderer in _OPERATIONS:
            if hasattr(Operations, name):
                delattr(Operations, name)
            Operations._to_impl._registry.pop((op_class, "default"), None)
            renderers._registry.pop((op_class, "default"), None)
        for key, hook in _hook_slots():
            entries = comparators._registry.get(key)
            if isinstance(entries, list):
                entries[:] = [entry for entry in entries if not _is_hook(entry, hook)]
        _state.installed = False


def is_installed() -> bool:
    """Whether :func:`install` has run (and :func:`uninstall` has not undone it)."""
    return _state.installed
