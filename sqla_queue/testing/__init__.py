"""Testing helpers for applications that use sqla_queue."""

__all__: list[str] = []
