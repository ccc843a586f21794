"""``sqla-queue jobs``, ``cancel``, ``result``, ``requeue`` and ``prune``: the commands on
jobs (see :mod:`sqla_queue.listing` and :mod:`sqla_queue.admin`); ``failed`` is in
:mod:`sqla_queue.cli.failed`."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqla_queue.admin import Pruned
from sqla_queue.checks import INT8_MAX
from sqla_queue.cli.failed import add_failed_parser, rows_by_id
from sqla_queue.cli.loading import CliError
from sqla_queue.cli.render import (
    TASK_WIDTH,
    Cell,
    Column,
    format_attempts,
    format_duration,
    format_time,
    json_text,
    print_table,
    say,
)
from sqla_queue.cli.scaffold import (
    COMMON_EXITS,
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_FINISHED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TIMEOUT,
    Subparsers,
    add_command,
    add_json,
    connected,
    engine_of,
    print_json,
)
from sqla_queue.cli.values import (
    about_row,
    job_states,
    non_empty,
    parse_duration,
    timeout,
    whole_number,
)
from sqla_queue.errors import (
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    ResultTimeoutError,
)
from sqla_queue.history import prune_history
from sqla_queue.listing import JobRow, list_jobs
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.lifecycle import CancelOutcome

__all__ = [
    "add_job_parsers",
    "cancel_words",
    "format_until",
    "prune_lines",
    "run_cancel",
    "run_jobs",
    "run_prune",
    "run_requeue",
    "run_result",
]

JOBS_HELP = f"""\
List jobs, newest first (by id), at most --limit of them: id, task, state, attempt
(made of allowed), created and finished times (UTC), unique key and linked row. Filters
combine with AND; a filter given several times (--task, --status) matches any of its
values. In a narrow terminal the last columns give way (--json has them all).

states: queued (every job not finished yet), succeeded, failed, cancelled, and the
states of a queued job: running, cancelling (running, asked to stop), waiting (behind
its queue_id), scheduled (due later), pending (due now), suspended (a durable job in a
wait), blocked (a workflow node waiting for its parents), held (a workflow node waiting
for its failed parent's requeue: `sqla-queue job ID` names it). When suspended jobs
are listed, two more columns say what each waits for (sleep,
signal:NAME, row:CONDITION:KEY, version:STEP) and until when ("no deadline": until its
signal, row or an operator; `sqla-queue signal` sends one). `sqla-queue job ID` shows
one job with its committed steps.

exit status:
  0  printed (also when no job matched)
{COMMON_EXITS}"""

CANCEL_HELP = f"""\
Cancel jobs: a queued job becomes cancelled and never starts; a running one is asked
to stop (its handler sees ctx.cancel_requested within a heartbeat interval) and ends
cancelled when its handler returns, unless it succeeds. A suspended durable job is
cancelled at once; the compensations of its committed steps follow (the next worker
maintenance sweep enqueues them), and its line says how many (--json: "compensations").
Prints each job's outcome: cancelled, requested, finished (already over: nothing
changed) or not_found.

exit status:
  0  every job was cancelled or asked to stop
{COMMON_EXITS}
  6  no job has one of the ids (the others were cancelled)
  7  one of the jobs had already finished (the others were cancelled)"""

RESULT_HELP = f"""\
Wait for a job to finish and print its handler's return value as JSON. A failed job's
error, its attempt and time, and the traceback the worker recorded go to stderr. The
wait LISTENs for the job's completion (and reads it every few seconds besides).

exit status:
  0  the job succeeded: its result is printed
{COMMON_EXITS}
  3  the job failed
  4  the job was cancelled
  5  the job was still queued or running when the timeout passed
  6  no job has this id (never enqueued, or pruned)
  130 interrupted (Ctrl-C)"""

REQUEUE_HELP = f"""\
Run failed or cancelled jobs again, with a fresh set of attempts, in one transaction.
Prints each job's outcome: requeued, left alone (it is in another state, or another job
holds its unique key) or not_found. The jobs that can be requeued are, whatever the others.

exit status:
  0  every job was requeued
{COMMON_EXITS}
  6  no job has one of the ids (the others were requeued)
  7  one of the jobs was left alone, and every id exists (the others were requeued)"""

PRUNE_HELP = f"""\
Delete finished jobs older than --older-than: succeeded and cancelled ones, and failed
ones too with --include-failed (they wait for inspection and requeue otherwise). On a
queue with partitioned history, whole partitions are dropped (or, with --detach,
detached and kept as tables). With the jobs go what they leave behind in every table,
under the same age: the unique keys they hold, durable steps and signals (those of jobs
that history="none" deleted too, once their newest is older than --older-than), and the
workflows none of whose jobs is left, with their nodes and edges. Prints the rows
removed from each table (--json: {{jobs, removed: {{table: rows}}, partitions}}).

exit status:
  0  pruned (also when nothing was old enough)
{COMMON_EXITS}"""


def add_job_parsers(sub: Subparsers) -> None:
    """Add ``failed``, ``jobs``, ``cancel``, ``result``, ``requeue`` and ``prune``."""
    add_failed_parser(sub)
    _add_jobs_parser(sub)
    ids = whole_number(1, INT8_MAX, "a job id")
    cancel = add_command(
        sub,
        "cancel",
        run_cancel,
        summary="cancel jobs: queued ones never start, running ones are asked to stop",
        description=CANCEL_HELP,
    )
    cancel.add_argument("ids", nargs="+", type=ids, help="job ids")
    cancel.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    _add_result_parser(sub)
    requeue = add_command(
        sub,
        "requeue",
        run_requeue,
        summary="run failed or cancelled jobs again",
        description=REQUEUE_HELP,
    )
    requeue.add_argument("ids", nargs="+", type=ids, help="job ids")
    requeue.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    prune = add_command(
        sub,
        "prune",
        run_prune,
        summary="delete finished jobs older than a given age",
        description=PRUNE_HELP,
    )
    prune.add_argument(
        "--older-than", type=parse_duration, required=True, help="age such as 7d, 12h, 30m, 90s"
    )
    prune.add_argument("--include-failed", action="store_true", help="failed jobs go too")
    prune.add_argument(
        "--detach",
        action="store_true",
        help="partitioned history: detach old partitions (kept as tables) instead of dropping",
    )
    add_json(prune)


def _add_jobs_parser(sub: Subparsers) -> None:
    jobs = add_command(
        sub,
        "jobs",
        run_jobs,
        summary="list jobs, newest first, by task, state, key or linked row",
        description=JOBS_HELP,
    )
    jobs.add_argument(
        "--task", action="append", type=non_empty("--task"), help="only this task (repeatable)"
    )
    jobs.add_argument(
        "--status",
        action="append",
        type=job_states,
        metavar="STATE",
        help="only jobs in this state; repeatable, or comma-separated (failed,cancelled)",
    )
    jobs.add_argument(
        "--key", type=non_empty("--key"), help="only jobs whose unique_key or queue_id is KEY"
    )
    jobs.add_argument(
        "--about",
        type=about_row,
        metavar="TABLE[:KEY]",
        help="only jobs linked to this row (orders:42), or to any row of TABLE",
    )
    jobs.add_argument(
        "--limit",
        type=whole_number(1, INT8_MAX, "--limit"),
        default=20,
        metavar="N",
        help="at most N jobs (default 20)",
    )
    add_json(jobs)


def _add_result_parser(sub: Subparsers) -> None:
    result = add_command(
        sub,
        "result",
        run_result,
        summary="wait for a job to finish and print its result as JSON",
        description=RESULT_HELP,
    )
    result.add_argument("id", type=whole_number(1, INT8_MAX, "a job id"), help="the job id")
    result.add_argument(
        "--timeout",
        type=timeout,
        default=30.0,
        help="longest wait: 30s (default), 5m, 0 (look once) or none (no limit)",
    )
    result.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object, whatever the outcome: {id, outcome, result | error}",
    )


# -- shared pieces ------------------------------------------------------------------------


# -- jobs -----------------------------------------------------------------------------------

_JOB_COLUMNS = (
    Column("id", right=True),
    Column("task", least=TASK_WIDTH),
    Column("state"),
    Column("attempt", drop=4),
    Column("created", drop=3),
    Column("finished", drop=5),
    Column("unique key", least=12, drop=2),
    Column("about", least=12, drop=1),
)
# With suspended jobs in the list: what each waits for, and until when, after the state.
_WAIT_COLUMNS = (
    *_JOB_COLUMNS[:3],
    Column("waits for", least=16, cut="end", drop=6),
    Column("until", drop=4),
    *_JOB_COLUMNS[3:],
)


_WAIT_COLUMNS_WHOLE = tuple(
    replace(column, whole=True) if column.header == "waits for" else column
    for column in _WAIT_COLUMNS
)


def format_until(until: dt.datetime | None) -> str:
    """A suspended job's deadline for people: a UTC time, or ``no deadline``."""
    return "no deadline" if until is None else format_time(until)


def run_jobs(args: argparse.Namespace) -> int:
    """Run ``sqla-queue jobs APP``; returns the exit status."""
    about_table, about_key = args.about if args.about else (None, None)
    states = [state for group in args.status or [] for state in group]
    with connected(args) as (queue, connection):
        rows = list_jobs(
            connection,
            queue.tables,
            limit=args.limit,
            tasks=args.task or [],
            states=states,
            key=args.key,
            about_table=about_table,
            about_key=about_key,
        )
    if args.json:
        print_json([row.as_json() for row in rows])
        return EXIT_OK
    waits = any(row.state == "suspended" for row in rows)
    table: list[Sequence[Cell]] = []
    for row in rows:
        wait: tuple[Cell, ...] = ()
        if waits:
            suspended = row.state == "suspended"
            wait = (
                (row.waits_for or "-") if suspended else "-",
                format_until(row.until) if suspended else "-",
            )
        table.append(
            (
                str(row.id),
                row.task,
                row.state,
                *wait,
                format_attempts(row.current_attempt, row.max_attempts),
                format_time(row.created_at),
                format_time(row.finished_at),
                row.unique_key if row.unique_key is not None else "-",
                f"{row.about_table}:{row.about_key}" if row.about_table is not None else "-",
            )
        )
    columns: tuple[Column, ...] = _JOB_COLUMNS
    if waits:
        # A listing of suspended jobs only is read for their waits: the other columns give
        # way before a wait is cut. In a mixed listing, a wait may be cut instead.
        whole = all(row.state == "suspended" for row in rows)
        columns = _WAIT_COLUMNS_WHOLE if whole else _WAIT_COLUMNS
    print_table(columns, table, empty="no jobs")
    return EXIT_OK


# -- cancel ---------------------------------------------------------------------------------

#: How ``cancel`` shows each outcome: its word, then what it means.
_CANCEL_WORDS = {
    CancelOutcome.CANCELLED: "cancelled",  # queued, or suspended in a durable wait
    CancelOutcome.REQUESTED: "requested (it is running: asked to stop, it ends cancelled "
    "unless it succeeds)",
    CancelOutcome.FINISHED: "finished (already {status}: nothing to cancel)",
    CancelOutcome.NOT_FOUND: "not_found (no job has this id)",
}


def _compensations_of(connection: Any, queue: Any, ids: Sequence[int]) -> dict[int, int]:
    """How many committed steps of each suspended job among ``ids`` declared a
    compensation: those a cancel enqueues (by id; the other ids are missing)."""
    rows = rows_by_id(connection, queue, ids)
    return {
        job_id: sum(1 for step in queue.job_steps(connection, job_id) if step.has_compensation)
        for job_id, row in rows.items()
        if row.state == "suspended"
    }


def cancel_words(outcome: str, status: str = "?", compensations: int | None = None) -> str:
    """What ``sqla-queue cancel`` says of one job: its outcome's word and meaning, and for
    a suspended durable job that was cancelled, the compensations that follow."""
    words = _CANCEL_WORDS[outcome].format(status=status)
    if outcome != CancelOutcome.CANCELLED or compensations is None:
        return words
    if compensations == 0:
        return words  # nothing to undo: nothing follows
    if compensations == 1:
        return f"{words}; 1 compensation follows (the next worker sweep enqueues it)"
    return f"{words}; {compensations} compensations follow (the next worker sweep enqueues them)"


def run_cancel(args: argparse.Namespace) -> int:
    """Run ``sqla-queue cancel APP ID...``; returns the exit status."""
    ids = list(dict.fromkeys(args.ids))
    with engine_of(args) as (queue, engine):
        # Which of them wait suspended, and what they would undo: read before the cancel.
        with engine.connect() as connection:
            compensations = _compensations_of(connection, queue, ids)
        # The cancel commits on a connection of its own; the statuses are read after it.
        outcomes = queue.cancel(engine, ids)
        finished = [job_id for job_id in ids if outcomes[job_id] == CancelOutcome.FINISHED]
        statuses: dict[int, str] = {}
        if finished:
            with engine.connect() as connection:
                rows = rows_by_id(connection, queue, finished)
            statuses = {job_id: row.status for job_id, row in rows.items()}
    follow = {
        job_id: count
        for job_id, count in compensations.items()
        if count and outcomes[job_id] == CancelOutcome.CANCELLED
    }
    if args.json:
        print_json(
            [
                {"id": job_id, "outcome": outcomes[job_id]}
                | ({"status": statuses[job_id]} if job_id in statuses else {})
                | ({"compensations": follow[job_id]} if job_id in follow else {})
                for job_id in ids
            ]
        )
    else:
        for job_id in ids:
            words = cancel_words(outcomes[job_id], statuses.get(job_id, "?"), follow.get(job_id))
            say(f"job {job_id}: {words}")
    found = set(outcomes.values())
    if CancelOutcome.NOT_FOUND in found:
        return EXIT_NOT_FOUND
    if CancelOutcome.FINISHED in found:
        return EXIT_FINISHED
    return EXIT_OK


# -- requeue --------------------------------------------------------------------------------


def _requeue_outcome(
    job_id: int, requeued: set[int], refused: dict[int, str], left: dict[int, JobRow]
) -> dict[str, Any]:
    """What became of one id: requeued, not_found, or left_alone with the reason."""
    if job_id in requeued:
        return {"id": job_id, "outcome": "requeued"}
    if job_id not in left:
        return {"id": job_id, "outcome": "not_found"}
    row = left[job_id]
    reason = refused.get(job_id) or (
        f"it is {row.state}: only failed and cancelled jobs are requeued"
    )
    return {"id": job_id, "outcome": "left_alone", "status": row.status, "reason": reason}


_REQUEUE_WORDS = {"requeued": "requeued", "not_found": "not_found (no job has this id)"}


def run_requeue(args: argparse.Namespace) -> int:
    """Run ``sqla-queue requeue APP ID...``; returns the exit status."""
    ids = list(dict.fromkeys(args.ids))
    with connected(args, begin=True) as (queue, connection):
        report = queue.requeue(connection, ids)
        requeued, refused = set(report), report.refused
        left = rows_by_id(connection, queue, [i for i in ids if i not in requeued])
    outcomes = [_requeue_outcome(job_id, requeued, refused, left) for job_id in ids]
    if args.json:
        print_json(outcomes)
    else:
        for entry in outcomes:
            shown = _REQUEUE_WORDS.get(entry["outcome"]) or f"left alone ({entry['reason']})"
            say(f"job {entry['id']}: {shown}")
    found = {entry["outcome"] for entry in outcomes}
    if "not_found" in found:
        return EXIT_NOT_FOUND
    return EXIT_FINISHED if "left_alone" in found else EXIT_OK


# -- result ---------------------------------------------------------------------------------


def _failure_detail(queue: Any, engine: Any, exc: JobFailedError) -> str:
    """A failed job's error, its attempt and time of failure, and its traceback."""
    with engine.connect() as connection:
        row = rows_by_id(connection, queue, [exc.job_id]).get(exc.job_id)
    lines = [str(exc)]
    if row is not None:
        attempt = format_attempts(row.attempts, row.max_attempts)
        lines.append(f"  attempt {attempt}, failed at {format_time(row.finished_at)}")
    traceback = str((exc.error or {}).get("traceback") or "").rstrip()
    if traceback:
        lines.append(traceback)
    return "\n".join(lines)


def run_result(args: argparse.Namespace) -> int:
    """Run ``sqla-queue result APP ID``; returns the exit status."""
    job_id = args.id
    report: dict[str, Any] = {"id": job_id}
    with engine_of(args) as (queue, engine):
        try:
            value = queue.result(engine, job_id, timeout=args.timeout)
        except JobFailedError as exc:
            status, report["outcome"], report["error"] = EXIT_FAILED, "failed", exc.error
            detail = str(exc) if args.json else _failure_detail(queue, engine, exc)
        except JobCancelledError as exc:
            status, report["outcome"], detail = EXIT_CANCELLED, "cancelled", str(exc)
        except ResultTimeoutError as exc:
            status, report["outcome"], detail = EXIT_TIMEOUT, "timeout", str(exc)
        except JobNotFoundError as exc:
            status, report["outcome"], detail = EXIT_NOT_FOUND, "not_found", str(exc)
        except KeyboardInterrupt:
            say(f"sqla-queue: interrupted while waiting for job {job_id}", file=sys.stderr)
            return EXIT_INTERRUPTED
        else:
            if args.json:
                print_json({"id": job_id, "outcome": "succeeded", "result": value})
            else:
                print(json_text(value, indent=None))
            return EXIT_OK
    if args.json:
        report["message"] = detail.splitlines()[0]
        print_json(report)
    else:
        say(f"sqla-queue: {detail}", file=sys.stderr)
    return status


# -- prune ----------------------------------------------------------------------------------


def prune_lines(pruned: Pruned, tables: QueueTables, older_than: dt.timedelta) -> list[str]:
    """What ``sqla-queue prune`` prints: a summary line, then one line per table (its
    name and the rows it lost, zeros included), each within 80 columns."""
    lines = [f"pruned {int(pruned)} finished job(s) older than {format_duration(older_than)}:"]
    counts = pruned.by_table(tables)
    width = max(len(name) for name in counts)
    lines += [f"  {name:<{width}}  {count:>8} row(s)" for name, count in counts.items()]
    return lines


def run_prune(args: argparse.Namespace) -> int:
    """Run ``sqla-queue prune APP --older-than AGE``; returns the exit status."""
    with connected(args, begin=True) as (queue, connection):
        if args.detach:
            try:
                report = prune_history(
                    connection,
                    queue.tables,
                    older_than=args.older_than,
                    include_failed=args.include_failed,
                    detach=True,
                )
            except ValueError as exc:  # --detach on a plain history: nothing was done
                raise CliError(str(exc)) from None
            pruned = report.pruned
        else:
            pruned = queue.prune(
                connection, older_than=args.older_than, include_failed=args.include_failed
            )
        tables = queue.tables
    if args.json:
        print_json(
            {
                "jobs": int(pruned),
                "removed": pruned.by_table(tables),
                "partitions": list(pruned.partitions),
                "detached": bool(args.detach),
            }
        )
        return EXIT_OK
    if args.detach:
        say(f"detached {len(pruned.partitions)} partition(s): {list(pruned.partitions)}")
    for line in prune_lines(pruned, tables, args.older_than):
        say(line)
    return EXIT_OK
