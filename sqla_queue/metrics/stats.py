"""The scrape-time query of the Prometheus collector, and how far its walks go.

The query (pending, running and oldest due age per task, each index walk stopped after
``cap`` entries) is built in :mod:`sqla_queue.statements.metrics`, which says what it
reads; it is exported here too, where the collector's documentation points.
"""

from __future__ import annotations

from sqla_queue.statements.metrics import QueueStatsParams, queue_stats_statement

__all__ = ["DEFAULT_CAP", "QueueStatsParams", "queue_stats_statement"]

#: Entries each walk of the scrape-time query reads at most, per task.
DEFAULT_CAP = 10_000
