"""Enqueue inside business transactions, then run a sync worker until the queue is empty."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sqlalchemy import create_engine, select
from sqlalchemy.orm import selectinload, sessionmaker

sys.path.insert(0, str(Path(__file__).parent))

from myapp.jobs import confirm, queue, rebuild_stats
from myapp.models import Base, Order

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres")


def main() -> None:
    """Create the tables, place three orders (one rolled back) and work the queue."""
    engine = create_engine(DATABASE_URL)
    with engine.begin() as connection:
        queue.create_all(connection)
        Base.metadata.create_all(connection, tables=[Order.__table__])
    SessionLocal = sessionmaker(engine)

    confirmations: dict[str, int] = {}
    for email, keep in [
        ("ada@example.com", True),
        ("bob@example.com", False),
        ("cy@example.com", True),
    ]:
        with SessionLocal() as session:
            order = Order(email=email)
            session.add(order)
            session.flush()  # the order's id, for the job and its link
            confirmations[email] = confirm(session, order)
            if keep:
                session.commit()
            else:
                session.rollback()  # the order and its job vanish together

    # Ada submits the form twice: the unique key finds her confirmation already queued.
    with SessionLocal.begin() as session:
        ada = session.scalars(select(Order).where(Order.email == "ada@example.com")).one()
        again = confirm(session, ada)
        print(f"ada@example.com submitted twice: one job: {again == confirmations[ada.email]}")
    with SessionLocal.begin() as session:
        rebuild_stats.options(delay=0).enqueue(session, reason="new orders")

    stats = queue.worker(SessionLocal, concurrency=4).run(burst=True)
    print(f"worker: {stats.succeeded} succeeded, {stats.failed} failed")
    # The app can wait for a job's outcome (here it is done already): its return value.
    cy_job = confirmations["cy@example.com"]
    print(f"cy@example.com's confirmation: {queue.result(engine, cy_job, timeout=10)}")
    with SessionLocal() as session:
        orders = select(Order).options(selectinload(Order.jobs)).order_by(Order.id)
        for order in session.scalars(orders):
            shown = ", ".join(f"{job.task} {job.state}" for job in order.jobs)
            print(f"{order.email}: confirmed={order.confirmed}; jobs: {shown}")
        for job in session.scalars(select(queue.Job).order_by(queue.Job.id)):
            print(f"job {job.id} {job.task}: {job.status} -> {job.result}")
    engine.dispose()


if __name__ == "__main__":
    main()
