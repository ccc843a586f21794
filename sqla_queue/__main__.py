"""``python -m sqla_queue``: the same as the ``sqla-queue`` command."""

from sqla_queue.cli.main import main

raise SystemExit(main())
