"""``sqla-queue dashboard``: serve the web dashboard (:mod:`sqla_queue.dashboard`) with uvicorn."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from sqlalchemy import text

from sqla_queue.cli.loading import CliError
from sqla_queue.cli.scaffold import EXIT_OK, Subparsers, add_command, engine_of

__all__ = ["DASHBOARD_HELP", "add_dashboard_parser", "run_dashboard"]

DASHBOARD_HELP = """\
Serve the queue's web dashboard: per-task counts and throughput, the jobs (filters,
details, errors), the workers. It listens on 127.0.0.1 by default: only this machine can
reach it. It is read-only unless --auth names a callable that accepts a request (see the
dashboard guide); actions then need the page's CSRF token.

Needs the dashboard extra: pip install 'sqla-queue[dashboard]'.

exit status:
  0  the server stopped (Ctrl-C)
  1  the database could not be reached or refused the command
  2  a usage error, or the extra is not installed (nothing was served)"""

#: Read when --secret is not given: the CSRF cookies' signing key.
SECRET_ENV = "SQLA_QUEUE_DASHBOARD_SECRET"


def add_dashboard_parser(sub: Subparsers) -> None:
    """Add the ``dashboard`` sub-command."""
    parser = add_command(
        sub,
        "dashboard",
        run_dashboard,
        summary="serve the web dashboard (read-only unless --auth is given)",
        description=DASHBOARD_HELP,
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument(
        "--auth",
        metavar="MODULE:CALLABLE",
        help="a callable taking the request, truthy to allow actions (default: read-only)",
    )
    parser.add_argument("--title", default="sqla_queue", help="the page title")
    parser.add_argument(
        "--pool-size", type=int, default=5, help="database connections at most (default: 5)"
    )


def _load_callable(path: str) -> Any:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"--auth expects MODULE:CALLABLE such as myapp.auth:is_admin, got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise CliError(f"--auth {path} is a {type(target).__name__}, not a callable")
    return target


def run_dashboard(args: argparse.Namespace) -> int:
    """Run ``sqla-queue dashboard APP``: serve until interrupted; returns the exit status."""
    try:
        # The dashboard extra (starlette, uvicorn): loaded only for this command.
        import uvicorn

        from sqla_queue.dashboard import create_dashboard
    except ImportError as exc:
        raise CliError(
            f"the dashboard needs its extra: pip install 'sqla-queue[dashboard]' ({exc})"
        ) from None
    if not 1 <= args.port <= 65535:
        raise CliError(f"--port must be from 1 to 65535, got {args.port}")
    if args.pool_size < 1:
        raise CliError(f"--pool-size must be at least 1, got {args.pool_size}")
    with engine_of(args, pool_size=args.pool_size, max_overflow=0) as (queue, engine):
        auth = _load_callable(args.auth) if args.auth else None
        # Fail here, with the CLI's message, rather than on the first page view.
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        try:
            app = create_dashboard(
                queue, engine, auth=auth, title=args.title, secret=os.environ.get(SECRET_ENV)
            )
        except (TypeError, ValueError) as exc:
            raise CliError(str(exc)) from None
        mode = "actions allowed by --auth" if auth is not None else "read-only"
        print(f"sqla-queue dashboard on http://{args.host}:{args.port}/ ({mode})", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK
