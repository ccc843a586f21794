"""The host's own models; the queue's tables join the same metadata."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """The application's declarative base."""


class Order(Base):
    """An order; placing one enqueues its confirmation in the same transaction."""

    __tablename__ = "example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))
    confirmed: Mapped[bool] = mapped_column(default=False)
