"""``sqla-queue job``, ``signal`` and ``durable``: one job with its committed steps, a
signal to a durable job, and the stored step versions (see the durable jobs guide)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from sqla_queue.checks import INT8_MAX
from sqla_queue.cli.failed import error_summary
from sqla_queue.cli.jobs import format_until
from sqla_queue.cli.render import (
    TASK_WIDTH,
    Cell,
    Column,
    format_attempts,
    format_time,
    json_text,
    make_console,
    print_table,
    say,
    table_width,
    wrap_items,
)
from sqla_queue.cli.scaffold import (
    COMMON_EXITS,
    EXIT_FINISHED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    Subparsers,
    add_command,
    add_json,
    connected,
    iso,
    print_json,
)
from sqla_queue.cli.values import non_empty, whole_number
from sqla_queue.durable import Signalled, StepRecord, StepVersion
from sqla_queue.errors import JobNotFoundError
from sqla_queue.listing import JobRow, list_jobs
from sqla_queue.workflows.listing import workflow_of_job

__all__ = [
    "DURABLE_HELP",
    "JOB_HELP",
    "SIGNAL_HELP",
    "add_durable_parsers",
    "run_job",
    "run_migrate",
    "run_signal",
    "run_versions",
]

JOB_HELP = f"""\
Show one job: its task, state, attempts, times and last error; for a suspended durable
job, what it waits for and until when ("no deadline": until its signal, its row or an
operator); then its committed steps, cursors and waits in commit order: name, kind,
version, attempt, when it committed, its compensation (-: none; declared: it runs if
the job finally fails or is cancelled; or the job that ran it) and its stored result
(JSON). A suspended job is in the attempt its steps name: a wait is not an attempt. --json
prints {{"job": ..., "steps": [...]}}.

exit status:
  0  printed
{COMMON_EXITS}
  6  no job has this id"""

SIGNAL_HELP = f"""\
Send signal NAME, with an optional JSON payload, to a durable job: its handler's
ctx.wait_for_signal(NAME) returns the payload. A job suspended waiting for it runs again
at once; a job that has not reached its wait yet finds it there. One signal per name and
job: a second one of the same name is not stored (the first one stands). Prints what
happened: stored (and whether the job woke), or why not.

exit status:
  0  the signal was stored for a job that has not finished
{COMMON_EXITS}
  6  no job has this id
  7  nothing for the job to read: a signal of this name was sent before, or the job had
     already finished"""

DURABLE_HELP = f"""\
The stored step versions of durable jobs. `versions` lists, per task and step, how many
queued jobs hold the step's result at each version (`ctx.step(NAME, version=N)`). After
a deploy that changed a step's version, jobs that stored an older one wait (suspended on
version:STEP); `migrate` declares the stored results of --from valid for --to, and wakes
those jobs: they run again with the stored results.

exit status:
  0  printed, or migrated (also when no job held the step at --from)
{COMMON_EXITS}"""

# -- job ------------------------------------------------------------------------------------

_STEP_COLUMNS = (
    Column("step", least=16, whole=True),
    # The step's name (a wait's names what it waits for) is cut last: the version (most
    # often 1) goes first, then the attempt and the kind (and, before any, a column of
    # dashes: see Column.blank).
    Column("kind", drop=3),
    Column("version", right=True, drop=1),
    Column("attempt", right=True, drop=2),
    Column("committed", drop=4),
    Column("compensation", drop=5),
    Column("result", least=16, cut="end"),
)


def _compensation(step: StepRecord) -> str:
    if not step.has_compensation:
        return "-"
    # Declared, not yet enqueued: it runs only if the job finally fails or is cancelled.
    return "declared" if step.compensated_by is None else f"job {step.compensated_by}"


def step_json(step: StepRecord) -> dict[str, Any]:
    """One committed step as ``--json`` prints it (times in ISO 8601)."""
    return {
        "name": step.name,
        "kind": step.kind,
        "version": step.version,
        "attempt": step.attempt,
        "result": step.result,
        "has_compensation": step.has_compensation,
        "compensated_by": step.compensated_by,
        "committed_at": iso(step.committed_at),
    }


def _print_job(row: JobRow, steps: Sequence[StepRecord]) -> None:
    console = make_console()
    width = table_width(console)
    header: list[Cell] = [
        (f"job {row.id}", "bold"),
        row.task,
        row.state,
        f"attempt {format_attempts(row.current_attempt, row.max_attempts)}"
        + (" (suspended in it)" if row.state == "suspended" else ""),
    ]
    if row.state == "suspended":
        header += [f"waits for {row.waits_for or '-'}", f"until {format_until(row.until)}"]
    header += [f"created {format_time(row.created_at)}"]
    if row.finished_at is not None:
        header.append(f"finished {format_time(row.finished_at)}")
    if row.last_error:
        header.append(f"last error {error_summary(row.last_error)}")
    for line in wrap_items(header, width):
        console.print(line)
    rows: list[Sequence[Cell]] = [
        (
            step.name,
            step.kind,
            str(step.version),
            str(step.attempt),
            format_time(step.committed_at),
            _compensation(step),
            json_text(step.result, indent=None),
        )
        for step in steps
    ]
    if rows or row.waits_for is not None:
        # Only a durable job has steps to speak of: a plain job's page says nothing of them.
        print_table(_STEP_COLUMNS, rows, empty="no committed steps", console=console)


def run_job(args: argparse.Namespace) -> int:
    """Run ``sqla-queue job APP ID``; returns the exit status."""
    with connected(args) as (queue, connection):
        found = list_jobs(connection, queue.tables, ids=[args.id], limit=1)
        steps = queue.job_steps(connection, args.id) if found else []
        # A held workflow node: say which parent to requeue, and the command.
        held = found and found[0].state == "held"
        node = workflow_of_job(connection, queue.tables, args.id) if held else None
    if not found:
        say(f"sqla-queue: no job has the id {args.id}", file=sys.stderr)
        return EXIT_NOT_FOUND
    assert isinstance(steps, list)
    hint = node.resume_hint(args.queue) if node is not None else None
    if args.json:
        print_json(
            {"job": found[0].as_json(), "steps": [step_json(s) for s in steps]}
            | ({"resume": hint} if hint else {})
        )
    else:
        _print_job(found[0], steps)
        if hint:
            say(hint)
    return EXIT_OK


# -- signal ---------------------------------------------------------------------------------


def _payload(text: str) -> Any:
    """An argparse type: a JSON document (``'{"ok": true}'``, ``42``, ``'"yes"'``)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(
            f"it nests lists and objects too deeply to be read ({len(text)} characters)"
        ) from None


def _signal_words(sent: Signalled) -> str:
    if not sent.stored:
        return "not stored: a signal of this name was sent to it before (the first stands)"
    if sent.status != "queued":
        return f"stored, but the job had already {sent.status}: it never reads it"
    if sent.woke:
        return "stored; the job was waiting for it and runs again"
    return "stored; the job reads it when it waits for it"


def run_signal(args: argparse.Namespace) -> int:
    """Run ``sqla-queue signal APP JOB_ID NAME``; returns the exit status."""
    try:
        with connected(args, begin=True, refusals=(TypeError, ValueError)) as (queue, conn):
            sent = queue.signal(conn, args.job_id, args.name, args.payload)
    except JobNotFoundError as exc:
        if args.json:
            print_json({"id": args.job_id, "name": args.name, "outcome": "not_found"})
        else:
            say(f"sqla-queue: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    assert isinstance(sent, Signalled)
    ok = sent.stored and sent.status == "queued"
    if args.json:
        print_json(
            {
                "id": sent.job_id,
                "name": sent.name,
                "outcome": "stored" if ok else "not_stored" if not sent.stored else "finished",
                "stored": sent.stored,
                "woke": sent.woke,
                "status": sent.status,
            }
        )
    else:
        say(f"job {sent.job_id}: signal {sent.name!r} {_signal_words(sent)}")
    return EXIT_OK if ok else EXIT_FINISHED


# -- durable versions / migrate -------------------------------------------------------------

_VERSION_COLUMNS = (
    Column("task", least=TASK_WIDTH),
    Column("step", least=16, whole=True),
    Column("version", right=True),
    Column("jobs", right=True),
)


def run_versions(args: argparse.Namespace) -> int:
    """Run ``sqla-queue durable versions APP``; returns the exit status."""
    with connected(args) as (queue, connection):
        versions = queue.step_versions(connection)
    assert isinstance(versions, list)
    listed: list[StepVersion] = versions
    if args.json:
        print_json(
            [{"task": v.task, "step": v.step, "version": v.version, "jobs": v.jobs} for v in listed]
        )
        return EXIT_OK
    rows: list[Sequence[Cell]] = [(v.task, v.step, str(v.version), str(v.jobs)) for v in listed]
    print_table(_VERSION_COLUMNS, rows, empty="no stored steps of queued jobs")
    return EXIT_OK


def run_migrate(args: argparse.Namespace) -> int:
    """Run ``sqla-queue durable migrate APP --task T --step S --from N --to M``."""
    with connected(args, begin=True, refusals=(TypeError, ValueError)) as (queue, connection):
        ids = queue.migrate_steps(
            connection,
            task=args.task,
            step=args.step,
            from_version=args.from_version,
            to_version=args.to_version,
        )
    assert isinstance(ids, list)
    if args.json:
        print_json({"task": args.task, "step": args.step, "migrated": ids})
    elif ids:
        say(
            f"migrated step {args.step!r} of {len(ids)} {args.task} job(s) from version "
            f"{args.from_version} to {args.to_version}: {', '.join(map(str, ids))}"
        )
    else:
        say(
            f"no queued {args.task} job holds step {args.step!r} at version "
            f"{args.from_version}: nothing migrated"
        )
    return EXIT_OK


# -- parsers --------------------------------------------------------------------------------


def add_durable_parsers(sub: Subparsers) -> None:
    """Add the ``job``, ``signal`` and ``durable`` (``versions``, ``migrate``) commands."""
    ids = whole_number(1, INT8_MAX, "a job id")
    job = add_command(
        sub,
        "job",
        run_job,
        summary="show one job: its state, what it waits for, its committed steps",
        description=JOB_HELP,
    )
    job.add_argument("id", type=ids, help="the job id")
    add_json(job)
    signal = add_command(
        sub,
        "signal",
        run_signal,
        summary="send a signal (with a JSON payload) to a durable job",
        description=SIGNAL_HELP,
    )
    signal.add_argument("job_id", type=ids, metavar="JOB_ID", help="the job id")
    signal.add_argument("name", type=non_empty("the signal's name"), help="the signal's name")
    signal.add_argument(
        "--payload", type=_payload, default=None, metavar="JSON", help="its payload (JSON)"
    )
    add_json(signal)
    durable = add_command(
        sub,
        "durable",
        _usage,
        summary="list or migrate the stored step versions of durable jobs",
        description=DURABLE_HELP,
        queue=False,
    )
    actions = durable.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_command(
        actions,
        "versions",
        run_versions,
        summary="per task and step, how many queued jobs hold each stored version",
        description=DURABLE_HELP,
        json=True,
    )
    migrate = add_command(
        actions,
        "migrate",
        run_migrate,
        summary="declare a step's stored results valid for a new version, wake the jobs",
        description=DURABLE_HELP,
    )
    migrate.add_argument("--task", required=True, type=non_empty("--task"), help="the task")
    migrate.add_argument("--step", required=True, type=non_empty("--step"), help="the step")
    version = whole_number(1, 2**31 - 1, "a version")
    migrate.add_argument(
        "--from", dest="from_version", required=True, type=version, metavar="N",
        help="the stored version",
    )  # fmt: skip
    migrate.add_argument(
        "--to", dest="to_version", required=True, type=version, metavar="M",
        help="the version the code has now",
    )  # fmt: skip
    add_json(migrate)


def _usage(args: argparse.Namespace) -> int:
    # Never run: argparse requires an action (versions or migrate) before this is reached.
    raise AssertionError("durable needs an action")
