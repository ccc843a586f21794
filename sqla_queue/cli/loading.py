"""Finding the user's Queue from ``module:attribute`` and building engines from URLs."""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from sqla_queue.queue import Queue

__all__ = ["CliError", "database_url", "load_queue", "shown_url"]


class CliError(Exception):
    """A usage problem the CLI reports in one line, without a traceback."""


def load_queue(path: str) -> Queue:
    """Import ``module:attribute`` (``myapp.jobs:queue``) and return the Queue it names."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"expected MODULE:ATTRIBUTE such as myapp.jobs:queue, got {path!r}")
    if os.getcwd() not in sys.path:
        # Like `python -m`, let the current directory's modules be found.
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Queue):
        raise CliError(f"{path} is a {type(target).__name__}, not a sqla_queue.Queue")
    return target


# user:password@ in a URL that does not parse: never echo the password.
_CREDENTIALS = re.compile(r"(?<=:)[^:@/]*(?=@)")


def database_url(explicit: str | None) -> str:
    """``--url``, else ``$DATABASE_URL``; plain ``postgresql://`` URLs get the psycopg driver.

    Raises :class:`CliError` when there is no URL, when it does not parse, or when it names
    another database than PostgreSQL; the message never shows a password.
    """
    url = explicit or os.environ.get("DATABASE_URL")
    source = "--url" if explicit else "$DATABASE_URL"
    if not url:
        raise CliError("no database: pass --url or set DATABASE_URL")
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            url = "postgresql+psycopg://" + url[len(plain) :]
            break
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        shown = _CREDENTIALS.sub("***", url)
        raise CliError(
            f"{source} is not a database URL: {shown!r}; "
            "expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        ) from None
    if parsed.get_backend_name() != "postgresql":
        raise CliError(
            f"{source} names a {parsed.get_backend_name()!r} database "
            f"({parsed.render_as_string(hide_password=True)}); sqla_queue needs PostgreSQL: "
            "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )
    return url


def shown_url(url: str) -> str:
    """``url`` for messages: its password replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _CREDENTIALS.sub("***", url)
