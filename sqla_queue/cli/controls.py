"""``sqla-queue pause``, ``resume`` and ``rate-limit``: per-task controls stored for every
worker (see :mod:`sqla_queue.controls`)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqla_queue.cli.render import TASK_WIDTH, Column, print_table, say

if TYPE_CHECKING:
    from sqla_queue.controls import RateLimit

__all__ = [
    "PAUSE_HELP",
    "RATE_LIMIT_HELP",
    "add_control_parsers",
    "format_rate",
    "parse_rate",
    "run_pause",
    "run_rate_limit",
    "run_resume",
]

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
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def format_rate(max_starts: int, per_seconds: float) -> str:
    """A rate as ``rate-limit set`` takes it: ``50/s``, ``100/10s``, ``1000/h``, ``5/7d``.

    The period in the largest unit that it is a whole number of (``3600`` seconds is
    ``h``), its count left out when it is 1.
    """
    for unit, size in reversed(_UNITS.items()):
        amount = per_seconds / size
        if amount >= 1 and amount == int(amount):
            return f"{max_starts}/{'' if amount == 1 else int(amount)}{unit}"
    return f"{max_starts}/{per_seconds:g}s"


def parse_rate(text: str) -> tuple[int, float]:
    """``N/PERIOD`` (``50/s``, ``100/10s``, ``1000/h``) as ``(max_starts, per_seconds)``."""
    from sqla_queue.cli.loading import CliError

    matched = _RATE.match(text.strip())
    if matched is None:
        raise CliError(f"a rate is N/PERIOD such as 50/s, 100/10s or 1000/h, got {text!r}")
    amount = float(matched["amount"]) if matched["amount"] else 1.0
    return int(matched["count"]), amount * _UNITS[matched["unit"]]


def add_control_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``pause``, ``resume`` and ``rate-limit`` sub-commands."""
    from sqla_queue.cli.main import _add_json, _add_target

    raw = argparse.RawDescriptionHelpFormatter
    for name, text, helped in (
        ("pause", PAUSE_HELP, "stop every worker claiming a task (running jobs finish)"),
        ("resume", RESUME_HELP, "let workers claim a paused task again"),
    ):
        parser = sub.add_parser(name, help=helped, description=text, formatter_class=raw)
        _add_target(parser)
        parser.add_argument("task", help="the task's name")
        _add_json(parser)
    rate = sub.add_parser(
        "rate-limit",
        help="list, set or unset per-task rate limits (starts per period, all workers)",
        description=RATE_LIMIT_HELP,
        formatter_class=raw,
        usage="sqla-queue rate-limit APP:QUEUE [list | set TASK RATE | unset TASK]",
    )
    _add_target(rate)
    rate.add_argument("words", nargs="*", help="list (default) | set TASK RATE | unset TASK")
    _add_json(rate)


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    from sqla_queue.cli.loading import CliError
    from sqla_queue.cli.main import EXIT_OK, _engine, _print_json, _target

    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            if paused:
                queue.pause(connection, args.task)
            else:
                queue.resume(connection, args.task)
    except (TypeError, ValueError) as exc:  # refused before anything was written
        raise CliError(str(exc)) from None
    finally:
        engine.dispose()
    if args.json:
        _print_json({"task": args.task, "paused": paused})
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
    from sqla_queue.cli.loading import CliError

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
    from sqla_queue.cli.loading import CliError
    from sqla_queue.cli.main import EXIT_OK, _engine, _print_json, _target

    action, task, rate = _rate_words(args.words)
    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            if action == "set":
                assert rate is not None
                queue.set_rate_limit(connection, task, rate[0], per=rate[1])
            elif action == "unset":
                queue.set_rate_limit(connection, task, None)
            controls = queue.controls(connection)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    finally:
        engine.dispose()
    limited = {name: c for name, c in controls.items() if c.rate_limit is not None}
    if action != "list":
        now = limited.get(task)
        rate_limit = now.rate_limit if now is not None else None
        shown = str(rate_limit) if rate_limit is not None else None
        if args.json:
            _print_json({"task": task, "rate_limit": shown})
        else:
            readable = _shown_rate(rate_limit) if rate_limit is not None else "none"
            say(f"{task}: rate limit now {readable}")
        return EXIT_OK
    if args.json:
        _print_json(
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
