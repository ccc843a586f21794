"""Metrics integrations. :mod:`sqla_queue.metrics.prometheus` needs the ``prometheus`` extra.

Importing this package imports no metrics library; :mod:`sqla_queue.metrics.stats` (the
scrape-time query) needs only SQLAlchemy.
"""
