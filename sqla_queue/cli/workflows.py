"""``sqla-queue workflows``: the recent workflows, or one workflow node by node (see
:mod:`sqla_queue.workflows.listing`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sqla_queue.checks import INT8_MAX
from sqla_queue.cli.loading import CliError
from sqla_queue.cli.render import (
    Cell,
    Column,
    format_time,
    make_console,
    print_table,
    say,
    table_width,
    wrap_items,
)
from sqla_queue.cli.scaffold import (
    COMMON_EXITS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    Subparsers,
    add_command,
    add_json,
    connected,
    print_json,
)
from sqla_queue.cli.values import whole_number
from sqla_queue.errors import WorkflowNotFoundError
from sqla_queue.workflows.admin import NodeStatus, WorkflowStatus
from sqla_queue.workflows.listing import (
    SHOWN_STATES,
    WorkflowSummary,
    list_workflows,
    read_workflow,
)

__all__ = ["WORKFLOWS_HELP", "add_workflows_parser", "run_workflows"]

WORKFLOWS_HELP = f"""\
Without an ID: the most recent workflows, newest first (by id), at most --limit of them:
id, name, state, how many nodes and how many show each state, the row it is about, and
when it was created (UTC). With an ID: that workflow's header, then one line per node:
name, job id, task, state, attempts made, parents.

A workflow is running (a node waits for its parents, or its job has not ended), held (a
node waits for an operator to requeue its failed parent: `sqla-queue requeue`), failed
(it ended with a node failed or cancelled), succeeded, or cancelled (by
queue.cancel_workflow).
A node shows blocked (waiting for its parents), held, its job's status once released
(queued, succeeded, failed, cancelled), or pruned (its job left the history).
--json prints the same, whole (with an ID: the workflow's status as_dict()).

exit status:
  0  printed (also when there is no workflow yet)
{COMMON_EXITS}
  6  no workflow has this id"""

#: How a state shows in a terminal: the colours of the failed and status listings.
_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "held": "bold yellow",
    "running": "cyan",
    "queued": "cyan",
}


def add_workflows_parser(sub: Subparsers) -> None:
    """Add the ``workflows`` sub-command."""
    parser = add_command(
        sub,
        "workflows",
        run_workflows,
        summary="list the recent workflows, or show one node by node",
        description=WORKFLOWS_HELP,
        usage="sqla-queue workflows [-h] [--url URL] [--limit N] [--before ID] [--json] queue [ID]",
    )
    # Words, not an optional positional: argparse would give an ID typed after --url to
    # no one (the top parser hands the words it left to this command's "words").
    parser.add_argument(
        "words", nargs="*", metavar="ID", help="the workflow to show (default: the list)"
    )
    parser.add_argument(
        "--limit",
        type=whole_number(1, INT8_MAX, "--limit"),
        default=20,
        metavar="N",
        help="list at most N workflows (default 20)",
    )
    parser.add_argument(
        "--before",
        type=whole_number(1, INT8_MAX, "--before"),
        default=None,
        metavar="ID",
        help="list only workflows with a smaller id (the next page after ID)",
    )
    add_json(parser)


def _state(word: str) -> Cell:
    return (word, _STYLES.get(word, ""))


def _counts(summary: WorkflowSummary) -> str:
    shown = [f"{summary.counts[s]} {s}" for s in SHOWN_STATES if s in summary.counts]
    return ", ".join(shown) or "-"


def _about(about: tuple[str, str] | None) -> str:
    return f"{about[0]}:{about[1]}" if about else "-"


# -- the list -------------------------------------------------------------------------------

_LIST_COLUMNS = (
    Column("id", right=True),
    Column("name", least=24),
    Column("state"),
    Column("nodes", right=True, drop=3),
    Column("by state", least=20, cut="end", drop=4),
    Column("about", least=12, drop=1),
    Column("created", drop=2),
)


def _print_list(summaries: Sequence[WorkflowSummary]) -> None:
    rows: list[Sequence[Cell]] = [
        (
            str(s.id),
            s.name,
            _state(s.state),
            str(s.nodes),
            _counts(s),
            _about(s.about),
            format_time(s.created_at),
        )
        for s in summaries
    ]
    print_table(_LIST_COLUMNS, rows, empty="no workflows")


# -- one workflow ---------------------------------------------------------------------------

_NODE_COLUMNS = (
    Column("node", least=24),
    Column("job", right=True),
    Column("task", least=16, drop=3),
    Column("state"),
    Column("attempts", right=True, drop=2),
    Column("parents", least=16, cut="end", drop=1),
)


def _node_row(node: NodeStatus) -> Sequence[Cell]:
    return (
        node.name,
        str(node.job_id),
        node.task if node.task is not None else "-",
        _state(node.shown_state),
        str(node.attempts) if node.attempts is not None else "-",
        ", ".join(node.parents) or "-",
    )


def _print_workflow(status: WorkflowStatus) -> None:
    console = make_console()
    width = table_width(console)
    header: list[Cell] = [
        (f"workflow {status.id}", "bold"),
        status.name,
        _state(status.state),
        f"{len(status.nodes)} node(s)",
        f"about {_about(status.about)}",
        f"created {format_time(status.created_at)}",
    ]
    if status.cancelled_at is not None:
        header.append(f"cancelled {format_time(status.cancelled_at)}")
    for line in wrap_items(header, width):
        console.print(line)
    print_table(
        _NODE_COLUMNS, [_node_row(n) for n in status.nodes], empty="no nodes", console=console
    )


# -- the command ----------------------------------------------------------------------------


def _workflow_id(words: Sequence[str]) -> int | None:
    """The workflow id among the command's words, if any; a usage error for anything else."""
    if not words:
        return None
    if len(words) > 1:
        raise CliError(
            f"unexpected arguments {' '.join(words)!r}; use: sqla-queue workflows APP [ID]"
        )
    try:
        return whole_number(1, INT8_MAX, "a workflow id")(words[0])
    except argparse.ArgumentTypeError as exc:
        raise CliError(str(exc)) from None


def run_workflows(args: argparse.Namespace) -> int:
    """Run ``sqla-queue workflows APP [ID]``; returns the exit status."""
    workflow_id = _workflow_id(args.words)
    if workflow_id is None:
        with connected(args) as (queue, connection):
            summaries = list_workflows(
                connection, queue.tables, limit=args.limit, before=args.before
            )
        if args.json:
            print_json([s.as_dict() for s in summaries])
        else:
            _print_list(summaries)
        return EXIT_OK
    try:
        with connected(args) as (queue, connection):
            status = read_workflow(connection, queue.tables, workflow_id)
    except WorkflowNotFoundError as exc:
        say(f"sqla-queue: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.json:
        print_json(status.as_dict())
    else:
        _print_workflow(status)
    return EXIT_OK
