"""The application's models, queue and tasks: what the web app and the workers import.

Run a worker with ``sqla-queue worker examples.flask_app.jobs:queue --url "$DATABASE_URL"``
or ``python -m examples.flask_app.worker`` (from the repository's root).
"""

from __future__ import annotations

from sqlalchemy import String, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext, Queue


class Base(DeclarativeBase):
    """The application's declarative base; the queue's tables join its metadata."""


class User(Base):
    """A user who signed up."""

    __tablename__ = "flask_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    welcomed: Mapped[bool] = mapped_column(default=False)


queue = Queue(Base)


@queue.task(name="send_welcome", pass_context=True, max_attempts=3)
def send_welcome(ctx: JobContext[Session], user_id: int) -> str:
    """Send the welcome mail (here: pretend to) and mark the user welcomed.

    Idempotent: a job runs at least once, so a second run sends nothing.
    """
    user = ctx.session.get(User, user_id)
    if user is None:
        raise LookupError(f"no user {user_id}")
    if not user.welcomed:
        print(f"welcome mail to {user.email} (user {user.id})")
        user.welcomed = True
        ctx.session.commit()
    return f"welcome mail sent to {user.email}"


def sign_up(session: Session, email: str) -> tuple[User, int]:
    """Create a user and enqueue the welcome mail in ``session``'s transaction.

    Returns the user and the job's id. Both exist only if the transaction commits.
    """
    user = User(email=email)
    session.add(user)
    session.flush()  # assigns user.id; a duplicate email fails here
    return user, send_welcome.enqueue(session, user.id)


def create_tables(connection: Connection) -> None:
    """Create the queue's tables and the app's, if missing.

    A real application adds them with its own Alembic migrations instead (see the
    Alembic guide); this keeps the example runnable on an empty database.
    """
    if not inspect(connection).has_table(queue.tables.jobs.name, schema=queue.tables.schema):
        queue.create_all(connection)
    Base.metadata.create_all(connection, tables=[User.__table__])
