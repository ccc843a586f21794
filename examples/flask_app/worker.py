"""The worker process: ``python -m examples.flask_app.worker`` (reads ``DATABASE_URL``).

The same as ``sqla-queue worker examples.flask_app.jobs:queue --url "$DATABASE_URL"``;
runs until SIGINT or SIGTERM, then finishes the jobs it is running. ``--burst`` stops it
once nothing is left to do.
"""

from __future__ import annotations

import logging
import os
import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from examples.flask_app.jobs import queue

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1/postgres"


def main(argv: list[str]) -> int:
    """Run a worker on ``$DATABASE_URL`` until stopped (or idle, with ``--burst``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    engine = create_engine(os.environ.get("DATABASE_URL", DEFAULT_URL), pool_size=5)
    stats = queue.worker(sessionmaker(engine), concurrency=4).run(burst="--burst" in argv)
    print(f"worker stopped: {stats}")
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
