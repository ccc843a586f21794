"""``sqla-queue status`` and ``sqla-queue top``: what the queue and its workers are doing
(see :mod:`sqla_queue.status`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group, RenderableType
    from sqlalchemy.engine import Engine

    from sqla_queue.queue import Queue
    from sqla_queue.status import QueueStatus, TaskStatus

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
  seats     capacity seats in use / the concurrency limit ("-": no limit)
  paused    yes: workers do not claim it (sqla-queue resume)
  fail/24h  jobs that failed for good in the last 24 hours (sqla-queue failed lists them)
  done/1m, done/1h  jobs finished (succeeded, failed, cancelled) in the last minute, hour
  (">=N": the window held more rows than a status read walks; N is a lower bound)
workers (live: seen in the last 60 s):
  worker (id prefix), host, pid, started, beat (time since its last beat, every <= 5 s),
  running (jobs it holds now / its concurrency), finished (jobs since it started), tasks"""

STATUS_HELP = f"""\
Show the queue at a glance: per task, the jobs pending, scheduled, waiting and running,
the age of the oldest due job, concurrency limit and seats in use, pauses, recent
failures and throughput; then the live workers. Reads only (a few small queries).

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


def add_status_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``status`` and ``top`` sub-commands."""
    from sqla_queue.cli.main import _add_json, _add_target, _seconds, _whole_number

    raw = argparse.RawDescriptionHelpFormatter
    status = sub.add_parser(
        "status",
        help="show per-task counts, limits, pauses, throughput and the live workers",
        description=STATUS_HELP,
        formatter_class=raw,
    )
    _add_target(status)
    _add_json(status)
    top = sub.add_parser(
        "top",
        help="a live dashboard of the queue and its workers (Ctrl-C to quit)",
        description=TOP_HELP,
        formatter_class=raw,
    )
    _add_target(top)
    top.add_argument(
        "--interval",
        type=_seconds(allow_zero=False),
        default=2.0,
        help="seconds between refreshes (default 2)",
    )
    frames = top.add_mutually_exclusive_group()
    frames.add_argument("--once", action="store_true", help="draw one frame and exit")
    frames.add_argument(
        "--iterations",
        type=_whole_number(1, 1_000_000_000, "--iterations"),
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
    """A duration for a narrow column: ``-``, ``0.4s``, ``12s``, ``3m05s``, ``2h14m``, ``3d04h``."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86_400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86_400}d{whole % 86_400 // 3600:02d}h"


def _seats(task: TaskStatus) -> str:
    if task.limit is None:
        return "-" if task.seats_in_use == 0 else str(task.seats_in_use)
    return f"{task.seats_in_use}/{task.limit}"


def _at_least(value: int, capped: bool) -> str:
    return f">={value}" if capped else str(value)


def _started(value: dt.datetime) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def render_status(status: QueueStatus, *, title: str = "") -> Group:
    """The status as ``status``/``top`` draw it: a summary line, the tasks, the workers."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    busy = sum(w.running for w in status.workers)
    seats = sum(w.concurrency for w in status.workers)
    now = status.now.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    summary = Text.assemble(
        (title + "  " if title else "", "bold"),
        f"{now}  ",
        f"pending {status.pending}  running {status.running}  ",
        f"done/min {_at_least(status.finished_last_minute, status.capped)}  ",
        f"workers {len(status.workers)} ({busy}/{seats} busy)",
    )
    tasks = Table(title="tasks", title_justify="left", expand=False)
    tasks.add_column("task", overflow="fold")
    # Headers as short as the numbers under them: the table fits 80 columns.
    for name in ("pending", "sched", "waiting", "running", "oldest", "seats"):
        tasks.add_column(name, justify="right", no_wrap=True)
    tasks.add_column("paused", no_wrap=True)
    for name in ("fail/24h", "done/1m", "done/1h"):
        tasks.add_column(name, justify="right", no_wrap=True)
    for t in status.tasks:
        tasks.add_row(
            t.task,
            str(t.pending),
            str(t.scheduled),
            str(t.waiting),
            str(t.running),
            format_age(t.oldest_due_seconds),
            _seats(t),
            Text("yes", style="bold yellow") if t.paused else Text("no"),
            Text(str(t.failed_last_day), style="red" if t.failed_last_day else ""),
            _at_least(t.finished_last_minute, status.capped),
            _at_least(t.finished_last_hour, status.capped),
        )
    workers = Table(title="workers", title_justify="left", expand=False)
    for name in ("worker", "host", "pid", "started", "beat", "running", "finished", "tasks"):
        justify: Any = "right" if name in ("pid", "beat", "running", "finished") else "left"
        workers.add_column(name, justify=justify, no_wrap=name != "tasks")
    for w in status.workers:
        workers.add_row(
            str(w.worker_id)[:8],
            w.hostname,
            str(w.pid),
            _started(w.started_at),
            format_age(w.seen_seconds_ago) + " ago",
            f"{w.running}/{w.concurrency}",
            str(w.finished),
            ", ".join(w.tasks),
        )
    parts: list[RenderableType] = [summary]
    parts.append(tasks if status.tasks else Text("no tasks", style="dim"))
    parts.append(workers if status.workers else Text("no live workers", style="dim"))
    return Group(*parts)


# -- commands -----------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    """Run ``sqla-queue status APP``; returns the exit status."""
    from rich.console import Console

    from sqla_queue.cli.main import EXIT_OK, _engine, _print_json, _target

    queue, url = _target(args)
    engine = _engine(url, pool_size=1, max_overflow=0)
    try:
        status = _reader(queue, engine)()
    finally:
        engine.dispose()
    if args.json:
        _print_json(status.as_json())
    else:
        Console().print(render_status(status, title=args.queue))
    return EXIT_OK


def run_top(args: argparse.Namespace, *, console: Any = None) -> int:
    """Run ``sqla-queue top APP``; returns the exit status (0 on Ctrl-C as well).

    ``console`` is the :class:`rich.console.Console` to draw on (tests pass a recording
    one); by default the terminal's.
    """
    from rich.console import Console

    from sqla_queue.cli.main import EXIT_OK, _engine, _target

    queue, url = _target(args)
    console = console if console is not None else Console()
    frames = 1 if args.once else args.iterations
    # One connection, kept between frames: a dashboard should not connect every second.
    engine = _engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)
    read = _reader(queue, engine)
    try:
        # The first read fails loudly (exit 1): a wrong URL is not something to watch.
        status = read()
        if args.json:
            _top_json(read, status, args.interval, frames)
        elif frames == 1:
            console.print(render_status(status, title=args.queue))
        else:
            _top_live(read, status, console, args.queue, args.interval, frames)
    except KeyboardInterrupt:
        # Ctrl-C is how top is meant to end.
        pass
    finally:
        engine.dispose()
    return EXIT_OK


def _frames_left(frames: int | None, shown: int) -> bool:
    return frames is None or shown < frames


def _next(read: Callable[[], QueueStatus]) -> QueueStatus | Exception:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return read()
    except SQLAlchemyError as exc:
        return exc


def _top_json(
    read: Callable[[], QueueStatus], status: QueueStatus, interval: float, frames: int | None
) -> None:
    print(json.dumps(status.as_json(), ensure_ascii=False), flush=True)
    shown = 1
    while _frames_left(frames, shown):
        time.sleep(interval)
        latest = _next(read)
        document = (
            latest.as_json() if not isinstance(latest, Exception) else {"error": _error(latest)}
        )
        print(json.dumps(document, ensure_ascii=False), flush=True)
        shown += 1


def _error(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _top_live(
    read: Callable[[], QueueStatus],
    status: QueueStatus,
    console: Any,
    title: str,
    interval: float,
    frames: int | None,
) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    hint = Text(f"refresh every {interval:g}s; Ctrl-C to quit", style="dim")
    with Live(
        Group(render_status(status, title=title), hint),
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
                problem = Text(f"refresh failed: {_error(latest)}; retrying", style="bold red")
                live.update(Group(render_status(status, title=title), problem), refresh=True)
            else:
                status = latest
                live.update(Group(render_status(status, title=title), hint), refresh=True)
            shown += 1
