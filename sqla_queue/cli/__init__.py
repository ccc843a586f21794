"""The ``sqla-queue`` command line."""

from sqla_queue.cli.main import main

__all__ = ["main"]
