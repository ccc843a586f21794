"""Tracing integrations. :mod:`sqla_queue.tracing.otel` needs the ``otel`` extra.

Importing this package imports no tracing library.
"""
