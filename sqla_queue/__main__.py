"""The ``sqla-queue`` command (and ``python -m sqla_queue``): the library's command line
with the shipped demo's ``sqla-queue demo`` added.

This module sits at the top, with the demo: the CLI below it does not know the demo.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from sqla_queue.cli.main import build_parser as cli_parser
from sqla_queue.cli.main import main as cli_main
from sqla_queue.demo import command as demo

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``sqla-queue`` sub-command, the demo's included."""
    return cli_parser([demo.add_parser])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sqla-queue`` command; returns the exit status."""
    return cli_main(argv, extra=[demo.add_parser])


if __name__ == "__main__":
    raise SystemExit(main())
