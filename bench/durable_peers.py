"""DBOS Transact (PyPI ``dbos``) as the peer of :mod:`bench.durable`.

The benchmark's own set-up installs it: :func:`ensure_dbos` runs ``pip install`` for
:data:`REQUIREMENT` in this interpreter's environment when it is missing (the ``bench``
extra lists it too). DBOS then runs in a process of its own,
``python -m bench.durable_peers --url URL ...``, against a scratch database of its own
on the same server (its system database, which also holds its datasource's outputs and
the steps' writes), created and dropped by :func:`run_dbos`. The process measures the
same shapes as :mod:`bench.durable` and prints one JSON line of figures.

Set-up, as close to sqla_queue's shapes as DBOS allows:

* A step that writes is a datasource transaction (``SQLAlchemyDatasource.transaction``):
  DBOS commits the write with its checkpoint in one transaction of the app database, as
  ``ctx.run_step`` does, then records the step in its system database. Its isolation is
  READ COMMITTED (DBOS's default is SERIALIZABLE), as ``ctx.session``'s.
* The drain enqueues its workflows on a queue with ``worker_concurrency`` = C and a
  0.1 s poll (DBOS's default is 1 s); the timed span is the same as sqla_queue's: from the
  first workflow's start to the last one's last step.
* The round trip: the workflow sets an in-process event just before ``DBOS.recv("go")``;
  the sender waits 30 ms more (the workflow is then blocked in ``recv``), calls
  ``DBOS.send`` and takes the time when it returns; the workflow's next step (a
  ``@DBOS.step``) returns ``time.time()`` taken first. DBOS delivers through its
  notifications table and LISTEN/NOTIFY, so the sender's being in the same process
  shortens nothing. A waiting DBOS workflow holds its thread meanwhile.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sqla_queue.testing.databases import url_for_database

__all__ = ["REQUIREMENT", "DbosUnavailable", "ensure_dbos", "main", "run_dbos"]

#: What the set-up installs.
REQUIREMENT = "dbos>=3.4,<4"
#: Seconds the DBOS process may take for every shape.
PROCESS_TIMEOUT = 300.0


class DbosUnavailable(RuntimeError):
    """DBOS cannot be installed or run here: the reason."""


def ensure_dbos(*, install: bool = True, log: Callable[[str], object] = print) -> str:
    """The installed DBOS version, after installing :data:`REQUIREMENT` if it is missing.

    Raises :class:`DbosUnavailable` when it is missing and ``install`` is false, or when
    the install fails.
    """
    if importlib.util.find_spec("dbos") is None:
        if not install:
            raise DbosUnavailable(f"dbos is not installed (pip install '{REQUIREMENT}')")
        log(f"  installing {REQUIREMENT} (the peer's set-up) ...")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", REQUIREMENT],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        importlib.invalidate_caches()
        if done.returncode != 0 or importlib.util.find_spec("dbos") is None:
            tail = (done.stderr or done.stdout).strip()[-600:]
            raise DbosUnavailable(f"pip install '{REQUIREMENT}' failed: {tail}")
    return importlib.metadata.version("dbos")


def _admin(server_url: str, statement: str) -> None:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(statement))
    finally:
        admin.dispose()


def run_dbos(
    server_url: str,
    name: str,
    options: dict[str, int],
    *,
    install: bool = True,
    log: Callable[[str], object] = print,
) -> dict[str, Any]:
    """DBOS's figures for ``options`` (see :func:`parse_args`), in database ``name``
    created on ``server_url`` for the run and dropped after it."""
    version = ensure_dbos(install=install, log=log)
    _admin(server_url, f'CREATE DATABASE "{name}"')
    try:
        command = [sys.executable, "-m", "bench.durable_peers"]
        command += ["--url", url_for_database(server_url, name)]
        for key, value in options.items():
            command += [f"--{key.replace('_', '-')}", str(value)]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=PROCESS_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            raise DbosUnavailable(f"the DBOS process took over {PROCESS_TIMEOUT:.0f} s") from None
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode != 0 or not lines:
            raise DbosUnavailable(
                f"the DBOS process exited with {done.returncode}: {done.stderr.strip()[-800:]}"
            )
        figures: dict[str, Any] = json.loads(lines[-1])
        figures["version"] = version
        return figures
    finally:
        _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: The side table and deferred trigger that mark a signal's commit (see :mod:`bench.durable`):
#: fired inside COMMIT, it records ``clock_timestamp()`` under the receiver's key.
MARKS_DDL = """
CREATE TABLE IF NOT EXISTS bench_signal_marks (receiver text PRIMARY KEY, at timestamptz);
CREATE OR REPLACE FUNCTION bench_mark_signal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_signal_marks VALUES (NEW.{key}::text, clock_timestamp())
  ON CONFLICT (receiver) DO UPDATE SET at = EXCLUDED.at;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS bench_mark_signal ON {table};
CREATE CONSTRAINT TRIGGER bench_mark_signal AFTER INSERT ON {table}
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bench_mark_signal();
"""
#: The marks, as (receiver, epoch seconds).
MARKS_READ = "SELECT receiver, extract(epoch FROM at)::float8 FROM bench_signal_marks"


def marks_ddl(table: str, key: str) -> str:
    """:data:`MARKS_DDL` for signals stored in ``table`` under receiver column ``key``."""
    return MARKS_DDL.replace("{table}", table).replace("{key}", key)


# -- the DBOS process -----------------------------------------------------------------------


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """Launch DBOS on ``args.url``, run every shape, return the figures."""
    from dbos import DBOS, DBOSConfig, SQLAlchemyDatasource

    sa_url = args.url.replace("postgresql://", "postgresql+psycopg://", 1)
    config: DBOSConfig = {
        "name": "sqlaq-bench-durable",
        "system_database_url": sa_url,
        "log_level": "WARNING",
        "max_executor_threads": max(64, 4 * args.concurrency),
        "sys_db_pool_size": 2 * args.concurrency + 10,
    }
    DBOS(config=config)
    ds = SQLAlchemyDatasource.create(sa_url, engine_kwargs={"pool_size": args.concurrency + 2})
    with ds.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS bench_durable_writes "
                "(workflow_id text NOT NULL, step int NOT NULL, PRIMARY KEY (workflow_id, step))"
            )
        )
    insert = text("INSERT INTO bench_durable_writes VALUES (:wf, :step)")
    ready = threading.Event()

    @ds.transaction(isolation_level="READ COMMITTED")
    def write(step: int) -> int:
        ds.sql_session().execute(insert, {"wf": DBOS.workflow_id, "step": step})
        return step

    @DBOS.workflow()
    def steps_wf(count: int) -> dict[str, float]:
        began = time.time()
        for i in range(count):
            write(i)
        return {"began": began, "ended": time.time()}

    @DBOS.step()
    def stamp() -> float:
        return time.time()

    @DBOS.workflow()
    def wait_wf() -> float:
        ready.set()
        DBOS.recv("go", timeout_seconds=30)
        return stamp()

    DBOS.launch()
    with ds.engine.begin() as conn:
        # DBOS's send commits before it returns: its commit moment is marked as sqla_queue's.
        conn.execute(text(marks_ddl("dbos.notifications", "destination_uuid")))
    try:
        drain_queue = DBOS.register_queue(
            "bench_drain", worker_concurrency=args.concurrency, polling_interval_sec=0.1
        )
        figures: dict[str, Any] = {}
        for _ in range(3):  # warm-up: connections, caches
            steps_wf(args.steps)
        one = [steps_wf(args.steps) for _ in range(args.step_jobs)]
        figures["one_job_steps_per_s"] = [args.steps / (r["ended"] - r["began"]) for r in one]
        handles = [drain_queue.enqueue(steps_wf, args.steps) for _ in range(args.jobs)]
        done = [h.get_result() for h in handles]
        span = max(r["ended"] for r in done) - min(r["began"] for r in done)
        figures["drain_jobs_per_s"] = args.jobs / span
        trips: list[tuple[str, float, float, float]] = []
        for i in range(args.round_trips + 3):
            ready.clear()
            handle = DBOS.start_workflow(wait_wf)
            if not ready.wait(10):
                raise RuntimeError("the waiting workflow did not start")
            time.sleep(0.03)
            called = time.time()
            DBOS.send(handle.workflow_id, "payload", topic="go")
            sent = time.time()
            at = handle.get_result()
            if i >= 3:  # the first three warm up
                trips.append((handle.workflow_id, at, called, sent))
        with ds.engine.connect() as conn:
            marks = {str(k): float(v) for k, v in conn.execute(text(MARKS_READ))}
        figures["signal_ms"] = [1000 * (at - marks[wf]) for wf, at, _, _ in trips]
        figures["signal_from_call_ms"] = [1000 * (at - called) for _, at, called, _ in trips]
        figures["signal_from_return_ms"] = [1000 * (at - sent) for _, at, _, sent in trips]
        with ds.engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM bench_durable_writes")).scalar_one()
        expected = args.steps * (3 + args.step_jobs + args.jobs)
        if rows != expected:
            raise RuntimeError(f"{rows} step writes, {expected} expected")
        figures["median_one_job_steps_per_s"] = statistics.median(figures["one_job_steps_per_s"])
        return figures
    finally:
        DBOS.destroy()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The DBOS process's command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.durable_peers")
    parser.add_argument("--url", required=True, help="URL of DBOS's scratch database")
    parser.add_argument("--steps", type=int, default=10, help="steps per job")
    parser.add_argument("--step-jobs", type=int, default=30, help="jobs run one at a time")
    parser.add_argument("--jobs", type=int, default=300, help="jobs of the drain")
    parser.add_argument("--concurrency", type=int, default=10, help="the drain's concurrency")
    parser.add_argument("--round-trips", type=int, default=200, help="signal round trips")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the DBOS side and print its figures as one JSON line."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    figures = _measure(parse_args(argv))
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
