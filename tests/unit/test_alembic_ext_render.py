"""How autogenerate writes the queue operations, without a database.

The ``clean_alembic`` fixture starts each test from an Alembic without alembic_ext and
restores the previous registrations afterwards.
"""

from __future__ import annotations

import io

import pytest
from alembic.autogenerate.api import AutogenContext
from alembic.autogenerate.render import render_op_text
from alembic.operations import Operations
from alembic.operations.ops import DowngradeOps, UpgradeOps
from alembic.runtime.migration import MigrationContext

import alembic_ext
from alembic_ext import CreateQueueOp, DropQueueOp, UpgradeQueueOp
from alembic_ext.render import IMPORT_LINE

pytestmark = pytest.mark.unit


def autogen_context(module_prefix: str = "op.") -> AutogenContext:
    """What autogenerate hands to renderers, for the PostgreSQL dialect and no database."""
    context = MigrationContext.configure(dialect_name="postgresql")
    return AutogenContext(
        context,
        opts={
            "alembic_module_prefix": module_prefix,
            "sqlalchemy_module_prefix": "sa.",
            "user_module_prefix": None,
        },
        autogenerate=False,
    )


def test_each_op_renders_as_one_call_with_every_argument_and_the_import(
    clean_alembic: None,
) -> None:
    alembic_ext.install()
    context = autogen_context()

    rendered = [
        render_op_text(context, CreateQueueOp("work", "sqla_queue_", version=1)),
        render_op_text(context, DropQueueOp(None, "q_", version=1)),
        render_op_text(context, UpgradeQueueOp(1, 2, "work", "q_")),
    ]

    assert rendered == [
        "op.create_queue(schema='work', prefix='sqla_queue_', version=1)",
        "op.drop_queue(schema=None, prefix='q_', version=1)",
        "op.upgrade_queue(from_version=1, to_version=2, schema='work', prefix='q_')",
    ]
    assert context.imports == {IMPORT_LINE}
    assert IMPORT_LINE == "import alembic_ext  # noqa: F401"


def test_the_module_prefix_is_respected(clean_alembic: None) -> None:
    alembic_ext.install()
    text = render_op_text(autogen_context("migration."), CreateQueueOp(version=1))
    assert text == "migration.create_queue(schema=None, prefix='sqla_queue_', version=1)"


def test_the_downgrade_renders_the_reverse(clean_alembic: None) -> None:
    alembic_ext.install()
    upgrade = UpgradeOps(ops=[CreateQueueOp("work", "q_", version=1)])
    downgrade = DowngradeOps(ops=[])
    upgrade.reverse_into(downgrade)

    [op] = downgrade.ops
    assert render_op_text(autogen_context(), op) == (
        "op.drop_queue(schema='work', prefix='q_', version=1)"
    )


def test_rendered_code_runs_as_the_same_operation(clean_alembic: None) -> None:
    """What autogenerate writes, executed as a migration would, emits the op's own SQL."""
    alembic_ext.install()
    op = UpgradeQueueOp(1, 1, "work", "q_")
    create = CreateQueueOp("work", "q_", version=1)
    source = "\n".join(render_op_text(autogen_context(), o) for o in (create, op))

    outputs = []
    for run in (
        lambda ops: exec(source, {"op": ops}),
        lambda ops: [ops.invoke(create), ops.invoke(op)],
    ):
        buffer = io.StringIO()
        context = MigrationContext.configure(
            dialect_name="postgresql", opts={"as_sql": True, "output_buffer": buffer}
        )
        run(Operations(context))
        outputs.append(buffer.getvalue())
    assert outputs[0] == outputs[1]
    assert "CREATE TABLE work.q_jobs" in outputs[0]


def test_without_install_there_is_no_renderer(clean_alembic: None) -> None:
    with pytest.raises(ValueError, match="no dispatch function"):
        render_op_text(autogen_context(), CreateQueueOp(version=1))
