"""``sqla-queue limits``, ``pause``, ``resume`` and ``rate-limit``: per-task controls stored
for every worker (see :mod:`sqla_queue.admin` and :mod:`sqla_queue.controls`)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from sqla_queue.checks import INT4_MAX
from sqla_queue.cli.loading import CliError
from sqla_queue.cli.render import TASK_WIDTH, Column, print_table, say
from sqla_queue.cli.scaffold import (
    COMMON_EXITS,
    EXIT_OK,
    Subparsers,
    add_command,
    connected,
    print_json,
)
from sqla_queue.cli.values import DURATION_UNITS, whole_number
from sqla_queue.controls import RateLimit

__all__ = [
    "LIMITS_HELP",
    "PAUSE_HELP",
    "RATE_LIMIT_HELP",
    "add_control_parsers",
    "add_limits_parser",
    "format_rate",
    "parse_rate",
    "run_limits",
    "run_pause",
    "run_rate_limit",
    "run_resume",
]

LIMITS_HELP = f"""\
List, set or unset per-task concurrency limits, shared by every worker:
  sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]
The list shows each limit declared in code, stored, and the one in effect. `set` takes a
task the queue knows; `unset` removes a stored limit (the one in code applies again).

exit status:
  0  done (list: printed)
{COMMON_EXITS}, or a task the queue does not know"""

PAUSE_HELP = """\
Pause a task for every worker: each stops claiming it within its maintenance interval
(5 s by default). Jobs already running finish; enqueues go on, and the jobs wait for
`sqla-queue resume`. Tasks that are not paused are unaffected.

exit status:
  0  the task is paused
  1  the database could not be reached or refused the command
  2  a usage error, or a task the queue does not know (nothing was done)"""

RESUME_HELP = """\
Resume a paused task: workers claim it again within their maintenance interval. The task
is one the queue knows, or one that is gone but still stored as paused (so that its pause
can be cleared).

exit status:
  0  the task is not paused
  1  the database could not be reached or refused the command
  2  a usage error, or a task the queue does not know and that is not paused
     (nothing was done)"""

RATE_LIMIT_HELP = """\
List, set or unset per-task rate limits: at most N starts in any window of a period,
across every worker, counted by the database clock. RATE is N/PERIOD, the period as a
number and a unit (s, m, h, d; the number may be left out for 1): 50/s, 100/10s, 1000/h.
A new limit reaches running workers within their maintenance interval; it combines with
a concurrency limit (`sqla-queue limits`).

exit status:
  0  done (list: printed)
  1  the database could not be reached or refused the command
  2  a usage error, or a task the queue does not know (nothing was done)"""

_RATE = re.compile(r"^(?P<count>\d+)/(?P<amount>\d+(?:\.\d+)?)?(?P<unit>[smhd])$")


def format_rate(max_starts: int, per_seconds: float) -> str:
    """A rate as ``rate-limit set`` takes it: ``50/s``, ``100/10s``, ``1000/h``, ``5/7d``.

    The period in the largest unit that it is a whole number of (``3600`` seconds is
    ``h``), its count left out when it is 1.
    """
    for unit, size in reversed(DURATION_UNITS.items()):
        amount = per_seconds / size
        if amount >= 1 and amount == int(amount):
            return f"{max_starts}/{'' if amount == 1 else int(amount)}{unit}"
    return f"{max_starts}/{per_seconds:g}s"


def parse_rate(text: str) -> tuple[int, float]:
    """``N/PERIOD`` (``50/s``, ``100/10s``, ``1000/h``) as ``(max_starts, per_seconds)``."""
    matched = _RATE.match(text.strip())
    if matched is None:
        raise CliError(f"a rate is N/PERIOD such as 50/s, 100/10s or 1000/h, got {text!r}")
    amount = float(matched["amount"]) if matched["amount"] else 1.0
    return int(matched["count"]), amount * DURATION_UNITS[matched["unit"]]


def add_limits_parser(sub: Subparsers) -> None:
    """Add the ``limits`` sub-command."""
    limits = add_command(
        sub,
        "limits",
        run_limits,
        summary="list, set or unset per-task concurrency limits (shared by all workers)",
        description=LIMITS_HELP,
        usage="sqla-queue limits APP:QUEUE [--url URL] [--json] [list | set TASK N | unset TASK]",
        json=True,
    )
    limits.add_argument("words", nargs="*", help="list (default) | set TASK N | unset TASK")


def add_control_parsers(sub: Subparsers) -> None:
    """Add the ``pause``, ``resume`` and ``rate-limit`` sub-commands."""
    for name, text, summary, run in (
        ("pause", PAUSE_HELP, "stop every worker claiming a task (running jobs finish)", run_pause),
        ("resume", RESUME_HELP, "let workers claim a paused task again", run_resume),
    ):
        parser = add_command(sub, name, run, summary=summary, description=text, json=True)
        parser.add_argument("task", help="the task's name")
    rate = add_command(
        sub,
        "rate-limit",
        run_rate_limit,
        summary="list, set or unset per-task rate limits (starts per period, all workers)",
        description=RATE_LIMIT_HELP,
        usage="sqla-queue rate-limit APP:QUEUE [list | set TASK RATE | unset TASK]",
        json=True,
    )
    rate.add_argument("words", nargs="*", help="list (default) | set TASK RATE | unset TASK")


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    # A TypeError or ValueError is the library refusing the task before anything was written.
    with connected(args, begin=True, refusals=(TypeError, ValueError)) as (queue, connection):
        if paused:
            queue.pause(connection, args.task)
        else:
            queue.resume(connection, args.task)
    if args.json:
        print_json({"task": args.task, "paused": paused})
    else:
        say(f"{args.task}: {'paused' if paused else 'resumed'}")
    return EXIT_OK


def run_pause(args: argparse.Namespace) -> int:
    """Run ``sqla-queue pause APP TASK``; returns the exit status."""
    return _set_paused(args, True)


def run_resume(args: argparse.Namespace) -> int:
    """Run ``sqla-queue resume APP TASK``; returns the exit status."""
    return _set_paused(args, False)


def _rate_words(words: Sequence[str]) -> tuple[str, str, tuple[int, float] | None]:
    usage = "use: sqla-queue rate-limit APP:QUEUE [list | set TASK RATE | unset TASK]"
    if not words or list(words) == ["list"]:
        return "list", "", None
    if words[0] == "set" and len(words) == 3:
        return "set", words[1], parse_rate(words[2])
    if words[0] == "unset" and len(words) == 2:
        return "unset", words[1], None
    raise CliError(f"unexpected arguments {' '.join(words)!r}; {usage}")


def run_rate_limit(args: argparse.Namespace) -> int:
    """Run ``sqla-queue rate-limit``: list, set or unset; returns the exit status."""
    action, task, rate = _rate_words(args.words)
    with connected(args, begin=True, refusals=(TypeError, ValueError)) as (queue, connection):
        if action == "set":
            assert rate is not None
            queue.set_rate_limit(connection, task, rate[0], per=rate[1])
        elif action == "unset":
            queue.set_rate_limit(connection, task, None)
        controls = queue.controls(connection)
    limited = {name: c for name, c in controls.items() if c.rate_limit is not None}
    if action != "list":
        now = limited.get(task)
        rate_limit = now.rate_limit if now is not None else None
        shown = str(rate_limit) if rate_limit is not None else None
        if args.json:
            print_json({"task": task, "rate_limit": shown})
        else:
            readable = _shown_rate(rate_limit) if rate_limit is not None else "none"
            say(f"{task}: rate limit now {readable}")
        return EXIT_OK
    if args.json:
        print_json(
            [
                {
                    "task": name,
                    "max_starts": c.rate_limit.max_starts,
                    "per_seconds": c.rate_limit.per_seconds,
                    "paused": c.paused,
                }
                for name, c in limited.items()
                if c.rate_limit is not None
            ]
        )
        return EXIT_OK
    rows = [
        (name, _shown_rate(c.rate_limit), "yes" if c.paused else "no")
        for name, c in limited.items()
        if c.rate_limit is not None
    ]
    print_table(_RATE_COLUMNS, rows, empty="no rate limits")
    return EXIT_OK


_RATE_COLUMNS = (
    Column("task", least=TASK_WIDTH),
    Column("rate limit", right=True),
    Column("paused"),
)


def _shown_rate(rate: RateLimit) -> str:
    return format_rate(rate.max_starts, rate.per_seconds)


# -- limits ---------------------------------------------------------------------------------


def _limits_words(words: Sequence[str]) -> tuple[str, str, int | None]:
    usage = "use: sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]"
    if not words or list(words) == ["list"]:
        return "list", "", None
    if words[0] == "set" and len(words) == 3:
        try:
            limit = whole_number(1, INT4_MAX, "the limit")(words[2])
        except argparse.ArgumentTypeError as exc:
            raise CliError(str(exc)) from None
        return "set", words[1], limit
    if words[0] == "unset" and len(words) == 2:
        return "unset", words[1], None
    raise CliError(f"unexpected arguments {' '.join(words)!r}; {usage}")


_LIMIT_COLUMNS = (
    Column("task", least=TASK_WIDTH),
    Column("declared in code", right=True),
    Column("stored", right=True),
    Column("effective", right=True),
)


def run_limits(args: argparse.Namespace) -> int:
    """Run ``sqla-queue limits``: list, set or unset; returns the exit status."""
    action, task, limit = _limits_words(args.words)
    with connected(args, begin=True, refusals=(ValueError,)) as (queue, connection):
        if action == "set":
            queue.set_limit(connection, task, limit)
        elif action == "unset":
            queue.set_limit(connection, task, None)
        current = queue.limits(connection)
    if action != "list":
        now = current.get(task)
        shown = now.effective if now is not None else None
        if args.json:
            print_json({"task": task, "effective": shown})
        else:
            say(f"{task}: limit now {shown if shown is not None else 'none'}")
        return EXIT_OK
    if args.json:
        print_json(
            [
                {
                    "task": name,
                    "declared": entry.declared,
                    "stored": entry.stored,
                    "effective": entry.effective,
                }
                for name, entry in current.items()
            ]
        )
        return EXIT_OK
    rows = [
        (
            name,
            str(entry.declared) if entry.declared is not None else "-",
            str(entry.stored) if entry.stored is not None else "-",
            str(entry.effective),
        )
        for name, entry in current.items()
    ]
    print_table(_LIMIT_COLUMNS, rows, empty="no concurrency limits")
    return EXIT_OK
