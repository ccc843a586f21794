"""``sqla-queue status`` and ``sqla-queue top``: what the queue and its workers are doing
(see :mod:`sqla_queue.status`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from sqla_queue.cli.render import (
    TASK_WIDTH,
    Cell,
    Column,
    escape,
    format_duration,
    format_time,
    json_text,
    make_console,
    table_lines,
    table_width,
    wrap_items,
)
from sqla_queue.cli.scaffold import EXIT_OK, Subparsers, add_command, engine_of, print_json
from sqla_queue.cli.values import seconds, whole_number

if TYPE_CHECKING:
    from rich.console import Console, Group, RenderableType
    from rich.text import Text
    from sqlalchemy.engine import Engine

    from sqla_queue.queue import Queue
    from sqla_queue.status import QueueStatus, TaskStatus, WorkerStatus

__all__ = [
    "STATUS_HELP",
    "TOP_HELP",
    "add_status_parsers",
    "format_age",
    "render_status",
    "run_status",
    "run_top",
]

_COLUMNS = """\
tasks (one row per task the queue knows, or that has jobs, a limit or a pause):
  pending   due now, waiting for a worker    sched    due later (delay, retry backoff)
  waiting   behind an earlier job of its queue_id
  running   held by a worker                 oldest   how long the oldest due job waits
  suspended durable jobs in a wait (sleep, signal, row, step version): no worker holds
            them; `sqla-queue jobs --status suspended` lists what each waits for
  seats     capacity seats in use / the concurrency limit ("-": no limit)
  paused    yes: workers do not claim it (sqla-queue resume)
  fail/24h  jobs that failed for good in the last 24 hours (sqla-queue failed lists them)
  done/1m, done/1h  jobs finished (succeeded, failed, cancelled) in the last minute, hour
  (">=N": the window held more rows than a status read walks; N is a lower bound)
workers (live: seen in the last 60 s):
  worker (id prefix), host, pid, started, beat (time since its last beat, every <= 5 s),
  running (jobs it holds now / its concurrency), finished (jobs since it started), tasks

Times are UTC. In a terminal too narrow for every column, columns are left out, done/1m
and sched first, and a last line names them (the task's name always shows; a name longer
than 32 characters may lose its middle). Printed to a pipe or a file, every column shows,
one row per line, nothing cut; $COLUMNS sets a width there too. --json has everything."""

STATUS_HELP = f"""\
Show the queue at a glance: per task, the jobs pending, scheduled, waiting, running and
suspended, the age of the oldest due job, concurrency limit and seats in use, pauses,
recent failures and throughput; then the live workers. Reads only (a few small queries).

{_COLUMNS}

exit status:
  0  printed
  1  the database could not be reached or refused the command
  2  a usage error (nothing was done)"""

TOP_HELP = f"""\
A live dashboard of `sqla-queue status`, redrawn every --interval seconds until Ctrl-C
(which exits with status 0). A database error after the first refresh is shown on the
screen and retried at the next refresh. --once draws one frame and exits; --iterations
N stops after N frames; --json prints one JSON document per line instead of drawing.

{_COLUMNS}

exit status:
  0  stopped with Ctrl-C, or after --once / --iterations
  1  the database could not be reached (first refresh) or refused the command
  2  a usage error (nothing was done)"""

# A status read never waits long on a busy server: the dashboard shows the error instead.
_STATEMENT_TIMEOUT = "SET LOCAL statement_timeout = '10s'"


def add_status_parsers(sub: Subparsers) -> None:
    """Add the ``status`` and ``top`` sub-commands."""
    add_command(
        sub,
        "status",
        run_status,
        summary="show per-task counts, limits, pauses, throughput and the live workers",
        description=STATUS_HELP,
        json=True,
    )
    top = add_command(
        sub,
        "top",
        run_top,
        summary="a live dashboard of the queue and its workers (Ctrl-C to quit)",
        description=TOP_HELP,
    )
    top.add_argument(
        "--interval",
        type=seconds(allow_zero=False),
        default=2.0,
        help="seconds between refreshes (default 2)",
    )
    frames = top.add_mutually_exclusive_group()
    frames.add_argument("--once", action="store_true", help="draw one frame and exit")
    frames.add_argument(
        "--iterations",
        type=whole_number(1, 1_000_000_000, "--iterations"),
        default=None,
        metavar="N",
        help="stop after N frames (default: until Ctrl-C)",
    )
    top.add_argument(
        "--json", action="store_true", help="print one JSON document per line, not a screen"
    )


# -- reading ------------------------------------------------------------------------------


def _reader(queue: Queue, engine: Engine) -> Callable[[], QueueStatus]:
    """A function reading the status in a fresh transaction (each frame's own ``now()``)."""

    def read() -> QueueStatus:
        with engine.connect() as connection:
            connection.exec_driver_sql(_STATEMENT_TIMEOUT)
            return queue.status(connection)

    return read


# -- rendering ----------------------------------------------------------------------------


def format_age(seconds: float | None) -> str:
    """An age or a wait, to two units: ``-``, ``0.4 s``, ``12 s``, ``3 min 5 s``, ``3 d 4 h``."""
    # A clock a little behind the database (a beat just now) reads as no time at all.
    return "-" if seconds is None else format_duration(max(seconds, 0.0), parts=2)


def _seats(task: TaskStatus) -> str:
    if task.limit is None:
        return "-" if task.seats_in_use == 0 else str(task.seats_in_use)
    return f"{task.seats_in_use}/{task.limit}"


def _at_least(value: int, capped: bool) -> str:
    return f">={value}" if capped else str(value)


# The columns go in their drop order when the terminal is narrow (the task never does):
# first the counts with nothing to show (every row 0 or "-": see Column.blank), then the
# ones a glance can do without, last the pending and running counts. A column with a value
# (the suspended jobs the summary counts) stays while one without any goes.
_ZERO = ("0", "-")
_TASK_COLUMNS = (
    Column("task", least=TASK_WIDTH),
    Column("pending", right=True, drop=10),
    Column("sched", right=True, drop=2, blank=_ZERO),
    Column("waiting", right=True, drop=3, blank=_ZERO),
    Column("running", right=True, drop=9),
    # A durable job's wait: 0 on queues without durable jobs, so it goes early then.
    Column("suspended", right=True, drop=3, blank=_ZERO),
    Column("oldest", right=True, drop=6),
    Column("seats", right=True, drop=4),
    Column("paused", drop=7),
    Column("fail/24h", right=True, drop=8, blank=_ZERO),
    Column("done/1m", right=True, drop=1, blank=_ZERO),
    Column("done/1h", right=True, drop=5, blank=_ZERO),
)

_WORKER_COLUMNS = (
    Column("worker"),
    Column("host", least=16, drop=6),
    Column("pid", right=True, drop=3),
    Column("started", drop=1),
    Column("beat", right=True, drop=5),
    Column("running", right=True, drop=7),
    Column("finished", right=True, drop=2),
    Column("tasks", least=20, cut="end"),
)


def _task_row(task: TaskStatus, capped: bool) -> list[Cell]:
    return [
        task.task,
        str(task.pending),
        str(task.scheduled),
        str(task.waiting),
        str(task.running),
        (str(task.suspended), "magenta" if task.suspended else ""),
        format_age(task.oldest_due_seconds),
        _seats(task),
        ("yes", "bold yellow") if task.paused else "no",
        (str(task.failed_last_day), "red" if task.failed_last_day else ""),
        _at_least(task.finished_last_minute, capped),
        _at_least(task.finished_last_hour, capped),
    ]


def _worker_row(worker: WorkerStatus) -> list[Cell]:
    return [
        str(worker.worker_id)[:8],  # --json has it whole
        worker.hostname,
        str(worker.pid),
        format_time(worker.started_at),
        format_age(worker.seen_seconds_ago) + " ago",
        f"{worker.running}/{worker.concurrency}",
        str(worker.finished),
        ", ".join(worker.tasks),
    ]


def render_status(status: QueueStatus, *, title: str = "", width: int | None = None) -> Group:
    """The status as ``status``/``top`` draw it: a summary, the tasks, the workers.

    With a ``width`` (a terminal's), no line is wider: the tables leave columns out (never
    the task's name) and cut long names. Without one (a pipe), everything shows in full,
    one row per line.
    """
    from rich.console import Group
    from rich.text import Text

    busy = sum(w.running for w in status.workers)
    seats = sum(w.concurrency for w in status.workers)
    summary: list[Cell] = [
        *([(title, "bold")] if title else []),
        format_time(status.now),
        f"pending {status.pending}",
        f"running {status.running}",
        *([f"suspended {status.suspended}"] if status.suspended else []),
        f"done/min {_at_least(status.finished_last_minute, status.capped)}",
        f"workers {len(status.workers)} ({busy}/{seats} busy)",
    ]
    parts: list[RenderableType] = list(wrap_items(summary, width))
    parts.append(Text("tasks", style="bold underline"))
    if status.tasks:
        rows = [_task_row(task, status.capped) for task in status.tasks]
        parts.extend(table_lines(_TASK_COLUMNS, rows, width))
    else:
        parts.append(Text("no tasks", style="dim"))
    parts.extend([Text(""), Text("workers", style="bold underline")])
    if status.workers:
        parts.extend(table_lines(_WORKER_COLUMNS, [_worker_row(w) for w in status.workers], width))
    else:
        parts.append(Text("no live workers", style="dim"))
    return Group(*parts)


# -- commands -----------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    """Run ``sqla-queue status APP``; returns the exit status."""
    with engine_of(args, pool_size=1, max_overflow=0) as (queue, engine):
        status = _reader(queue, engine)()
    if args.json:
        print_json(status.as_json())
    else:
        console = make_console()
        console.print(render_status(status, title=args.queue, width=table_width(console)))
    return EXIT_OK


def run_top(args: argparse.Namespace, *, console: Console | None = None) -> int:
    """Run ``sqla-queue top APP``; returns the exit status (0 on Ctrl-C as well).

    ``console`` is the :class:`rich.console.Console` to draw on (tests pass a recording
    one); by default the terminal's. Each frame fits its width at that moment.
    """
    console = console if console is not None else make_console()
    frames = 1 if args.once else args.iterations
    # One connection, kept between frames: a dashboard should not connect every second.
    with engine_of(args, pool_size=1, max_overflow=0, pool_pre_ping=True) as (queue, engine):
        read = _reader(queue, engine)
        try:
            # The first read fails loudly (exit 1): a wrong URL is not something to watch.
            status = read()
            if args.json:
                _top_json(read, status, args.interval, frames)
            elif frames == 1:
                console.print(render_status(status, title=args.queue, width=table_width(console)))
            else:
                _top_live(read, status, console, args.queue, args.interval, frames)
        except KeyboardInterrupt:
            # Ctrl-C is how top is meant to end.
            pass
    return EXIT_OK


def _frames_left(frames: int | None, shown: int) -> bool:
    return frames is None or shown < frames


def _next(read: Callable[[], QueueStatus]) -> QueueStatus | Exception:
    try:
        return read()
    except SQLAlchemyError as exc:
        return exc


def _top_json(
    read: Callable[[], QueueStatus], status: QueueStatus, interval: float, frames: int | None
) -> None:
    print(json_text(status.as_json(), indent=None), flush=True)
    shown = 1
    while _frames_left(frames, shown):
        time.sleep(interval)
        latest = _next(read)
        document = (
            latest.as_json() if not isinstance(latest, Exception) else {"error": _error(latest)}
        )
        print(json_text(document, indent=None), flush=True)
        shown += 1


def _error(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _frame(status: QueueStatus, console: Console, title: str, note: Text) -> Group:
    """One screen of ``top``: the status fitted to the console's width now, and a note."""
    from rich.console import Group

    width = table_width(console)
    if width is not None:
        note.truncate(width, overflow="ellipsis")
    return Group(render_status(status, title=title, width=width), note)


def _top_live(
    read: Callable[[], QueueStatus],
    status: QueueStatus,
    console: Console,
    title: str,
    interval: float,
    frames: int | None,
) -> None:
    from rich.live import Live
    from rich.text import Text

    def hint() -> Text:
        return Text(f"refresh every {format_duration(interval)}; Ctrl-C to quit", style="dim")

    with Live(
        _frame(status, console, title, hint()),
        console=console,
        auto_refresh=False,
        transient=False,
    ) as live:
        shown = 1
        while _frames_left(frames, shown):
            time.sleep(interval)
            latest = _next(read)
            if isinstance(latest, Exception):
                # Keep the last good frame on screen, with what went wrong under it.
                problem = f"refresh failed: {escape(_error(latest))}; retrying"
                note = Text(problem, style="bold red")
                live.update(_frame(status, console, title, note), refresh=True)
            else:
                status = latest
                live.update(_frame(status, console, title, hint()), refresh=True)
            shown += 1
