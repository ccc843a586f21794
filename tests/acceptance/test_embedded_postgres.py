"""The embedded PostgreSQL fallback starts, serves queries, stops and restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sqla_queue.testing.embedded import start_embedded_postgres

pytestmark = pytest.mark.acceptance


def _select_one(url: str) -> object:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar()
    finally:
        engine.dispose()


def test_embedded_server_starts_answers_and_stops(server_tmp_path: Path) -> None:
    data_dir = server_tmp_path / "pgdata"
    server = start_embedded_postgres(data_dir)
    try:
        assert server.url.startswith("postgresql+psycopg://")
        assert server.data_dir == data_dir.resolve()
        assert _select_one(server.url) == 1
    finally:
        server.stop()
    assert server.stopped
    # pg_ctl removes the lock file once the postmaster has exited.
    assert not (data_dir / "postmaster.pid").exists()
    server.stop()  # idempotent


def test_embedded_server_restarts_on_an_existing_data_dir(server_tmp_path: Path) -> None:
    data_dir = server_tmp_path / "pgdata"
    with start_embedded_postgres(data_dir) as first:
        engine = create_engine(first.url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(text("CREATE TABLE survives_restart (id integer)"))
        finally:
            engine.dispose()
    assert not (data_dir / "postmaster.pid").exists()

    with start_embedded_postgres(data_dir) as second:
        engine = create_engine(second.url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                found = conn.execute(text("SELECT to_regclass('survives_restart')")).scalar()
        finally:
            engine.dispose()
    assert found is not None


def test_embedded_server_does_not_listen_on_tcp(server_tmp_path: Path) -> None:
    with start_embedded_postgres(server_tmp_path / "pgdata") as server:
        engine = create_engine(server.url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                listen = conn.execute(text("SHOW listen_addresses")).scalar()
        finally:
            engine.dispose()
    # Only a unix socket: no competition with a system server for 127.0.0.1:5432.
    assert listen == ""
