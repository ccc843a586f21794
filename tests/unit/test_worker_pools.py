"""The worker's own pool, without a database: how ``pool_size`` is checked and split, and
what the derived engine shares with the handlers' engine (its connections are tested in
tests/integration/test_worker_pool.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, NullPool, QueuePool

from sqla_queue import WorkerSettings
from sqla_queue.worker.pools import own_pool_engine, split_pool_size

pytestmark = pytest.mark.unit

URL = "postgresql+psycopg://app@db.invalid/app"


def test_pool_size_defaults_to_three_and_is_a_whole_number_from_1_to_100() -> None:
    assert WorkerSettings().pool_size == 3
    assert WorkerSettings(pool_size=1).pool_size == 1
    for wrong in (0, 101, -1):
        with pytest.raises(ValueError, match="pool_size"):
            WorkerSettings(pool_size=wrong)
    for wrong_type in (True, 2.0, "3"):
        with pytest.raises(TypeError, match="pool_size"):
            WorkerSettings(pool_size=wrong_type)  # type: ignore[arg-type]


def test_an_async_worker_keeps_one_connection_for_its_loop_and_the_rest_for_threads() -> None:
    assert split_pool_size(3, asynchronous=False) == (3, 3)
    assert split_pool_size(3, asynchronous=True) == (1, 2)
    assert split_pool_size(1, asynchronous=True) == (1, 1)


def test_the_own_engine_shares_all_but_the_pool() -> None:
    engine = create_engine(URL, pool_size=1, max_overflow=0)
    tenant = engine.execution_options(schema_translate_map={None: "tenant_7"})
    own = own_pool_engine(tenant, 3)
    assert own.pool is not engine.pool
    assert isinstance(own.pool, QueuePool) and own.pool.size() == 3
    assert own.dialect is engine.dialect and own.url == engine.url
    assert own.get_execution_options()["schema_translate_map"] == {None: "tenant_7"}
    parent_pool = engine.pool
    own.dispose()
    assert engine.pool is parent_pool and own.pool is not parent_pool


def test_an_async_engine_gets_an_async_pool_and_an_unpooled_one_stays_unpooled() -> None:
    async_engine = create_async_engine(URL, pool_size=1, max_overflow=0)
    own = own_pool_engine(async_engine.sync_engine, 1)
    assert isinstance(own.pool, AsyncAdaptedQueuePool) and own.pool.size() == 1
    unpooled = create_engine(URL, poolclass=NullPool)
    assert isinstance(own_pool_engine(unpooled, 3).pool, NullPool)
