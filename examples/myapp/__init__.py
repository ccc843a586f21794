"""A small host application that uses sqla_queue."""
