"""The same application from asyncio: AsyncSession enqueue and the asyncio worker."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

sys.path.insert(0, str(Path(__file__).parent))

from myapp.jobs import queue, rebuild_stats

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres")


async def main() -> None:
    """Enqueue from an AsyncSession and drain with the asyncio worker."""
    engine = create_async_engine(DATABASE_URL)
    async with engine.begin() as connection:
        await connection.run_sync(queue.create_all)
    SessionLocal = async_sessionmaker(engine)

    async with SessionLocal() as session, session.begin():
        for n in range(3):
            await rebuild_stats.enqueue(session, reason=f"batch {n}")

    stats = await queue.async_worker(SessionLocal, concurrency=4).run(burst=True)
    print(f"async worker: {stats.succeeded} succeeded")
    async with SessionLocal() as session:
        done = await session.scalar(
            select(func.count()).select_from(queue.Job).where(queue.Job.status == "succeeded")
        )
        print(f"succeeded jobs in the database: {done}")
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
