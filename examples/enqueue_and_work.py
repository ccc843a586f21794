"""Enqueue inside business transactions, then run a sync worker until the queue is empty."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, str(Path(__file__).parent))

from myapp.jobs import queue, rebuild_stats, send_confirmation
from myapp.models import Base, Order

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres")


def main() -> None:
    """Create the tables, place three orders (one rolled back) and work the queue."""
    engine = create_engine(DATABASE_URL)
    with engine.begin() as connection:
        queue.create_all(connection)
        Base.metadata.create_all(connection, tables=[Order.__table__])
    SessionLocal = sessionmaker(engine)

    for email, keep in [
        ("ada@example.com", True),
        ("bob@example.com", False),
        ("cy@example.com", True),
    ]:
        with SessionLocal() as session:
            order = Order(email=email)
            session.add(order)
            session.flush()
            send_confirmation.enqueue(session, order.id)
            if keep:
                session.commit()
            else:
                session.rollback()  # the order and its job vanish together
    with SessionLocal.begin() as session:
        rebuild_stats.options(delay=0).enqueue(session, reason="new orders")

    stats = queue.worker(SessionLocal, concurrency=4).run(burst=True)
    print(f"worker: {stats.succeeded} succeeded, {stats.failed} failed")
    with SessionLocal() as session:
        for order in session.scalars(select(Order).order_by(Order.id)):
            print(f"{order.email}: confirmed={order.confirmed}")
        for job in session.scalars(select(queue.Job).order_by(queue.Job.id)):
            print(f"job {job.id} {job.task}: {job.status} -> {job.result}")
    engine.dispose()


if __name__ == "__main__":
    main()
