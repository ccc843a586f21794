"""The application's models, queue and tasks: the part workers and tests import.

``sqla-queue worker examples.fastapi_app.jobs:queue`` runs these tasks in a process of
its own; the app in :mod:`examples.fastapi_app.app` runs them in-process.
"""

from __future__ import annotations

from sqlalchemy import String, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import Queue


class Base(DeclarativeBase):
    """The application's declarative base; the queue's tables join its metadata."""


class User(Base):
    """A user who signed up."""

    __tablename__ = "fastapi_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)


queue = Queue(Base)


@queue.task(name="send_welcome", max_attempts=3)
async def send_welcome(user_id: int, email: str) -> str:
    """Send the welcome mail (here: pretend to), and return what was sent.

    An ``async def`` handler: the asyncio worker awaits it in the app's event loop.
    """
    print(f"welcome mail to {email} (user {user_id})")
    return f"welcome mail sent to {email}"


def create_tables(connection: Connection) -> None:
    """Create the queue's tables and the app's, if missing.

    A real application adds them with its own Alembic migrations instead (see the
    Alembic guide); this keeps the example runnable on an empty database.
    """
    if not inspect(connection).has_table(queue.tables.jobs.name, schema=queue.tables.schema):
        queue.create_all(connection)
    Base.metadata.create_all(connection, tables=[User.__table__])
