"""``sqla-queue demo`` runs end to end, on a given server and on the embedded fallback.

The demo checks itself, but these tests do not take its word for it: they recount the shop's
tables afterwards and compare them with what the demo must have done.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sqla_queue.demo.run import DECLINE_RATE
from sqla_queue.demo.shop import DEMO_SCHEMA

pytestmark = pytest.mark.acceptance

_REPO = Path(__file__).resolve().parents[2]


def _run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ if env is None else env)
    # A wide virtual terminal keeps rich from wrapping the lines the tests look for.
    environment["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "sqla_queue", "demo", *args],
        cwd=_REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _fetch(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


# The demo's two worker processes, its shop and its report hold up to about 30 at once.
@pytest.mark.connection_budget(35)
def test_demo_on_a_given_database_commits_confirms_and_rolls_back(empty_db_url: str) -> None:
    # A first, smaller run leaves its tables behind; the second must replace them.
    first = _run_demo("--url", empty_db_url, "--orders", "40", "--workers", "1")
    assert first.returncode == 0, first.stdout + first.stderr

    orders = 300
    result = _run_demo("--url", empty_db_url, "--orders", str(orders))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Recreating schema" in output
    assert "All checks passed" in output

    s = DEMO_SCHEMA
    order_ids = {row[0] for row in _fetch(empty_db_url, f"SELECT id FROM {s}.orders")}
    jobs = _fetch(
        empty_db_url,
        f"SELECT (payload->'kwargs'->>'order_id')::bigint, status, id FROM {s}.sqla_queue_jobs",
    )
    confirmations = _fetch(
        empty_db_url, f"SELECT order_id, job_id, worker_pid FROM {s}.confirmations"
    )
    live_executions = _fetch(empty_db_url, f"SELECT count(*) FROM {s}.sqla_queue_job_executions")

    # The schema was recreated, so the identity restarted: every order number 1..300 was
    # drawn, and the declined ones are the gaps.
    declined = set(range(1, orders + 1)) - order_ids
    assert len(declined) == round(orders * DECLINE_RATE)
    assert max(order_ids) <= orders
    assert len(order_ids) == orders - len(declined)

    # One job per committed order, none for a declined one, all succeeded.
    job_orders = [order_id for order_id, _, _ in jobs]
    assert sorted(job_orders) == sorted(order_ids)
    assert {status for _, status, _ in jobs} == {"succeeded"}
    assert live_executions == [(0,)]

    # Exactly one confirmation per committed order, sent by that order's own job.
    confirmed = [order_id for order_id, _, _ in confirmations]
    assert sorted(confirmed) == sorted(order_ids)
    job_of_order = {order_id: job_id for order_id, _, job_id in jobs}
    assert all(job_of_order[order_id] == job_id for order_id, job_id, _ in confirmations)
    # The work was done by worker processes, not by the demo process itself.
    assert all(pid != os.getpid() for _, _, pid in confirmations)


def test_demo_refuses_to_drop_a_schema_it_did_not_create(empty_db_url: str) -> None:
    engine = create_engine(empty_db_url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA {DEMO_SCHEMA}"))
            connection.execute(text(f"CREATE TABLE {DEMO_SCHEMA}.precious (id int)"))
            connection.execute(text(f"INSERT INTO {DEMO_SCHEMA}.precious VALUES (1)"))
    finally:
        engine.dispose()

    result = _run_demo("--url", empty_db_url, "--orders", "10")

    assert result.returncode == 2, result.stdout + result.stderr
    assert "refusing to drop it" in result.stdout
    assert _fetch(empty_db_url, f"SELECT id FROM {DEMO_SCHEMA}.precious") == [(1,)]


@pytest.mark.skipif(
    importlib.util.find_spec("pgserver") is None, reason="pgserver (the embedded server) missing"
)
def test_demo_without_a_url_starts_an_embedded_server(server_tmp_path: Path) -> None:
    data_dir = server_tmp_path / "pgdata"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    # Its own data directory, so parallel runs never share (and reset) one demo schema.
    env["SQLA_QUEUE_PGDATA"] = str(data_dir)

    result = _run_demo("--orders", "60", env=env)

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "started an embedded PostgreSQL" in result.stdout
    assert str(data_dir.resolve()) in result.stdout
    assert "All checks passed" in result.stdout
    # The demo stops the server it started.
    assert (data_dir / "PG_VERSION").exists()
    assert not (data_dir / "postmaster.pid").exists()
