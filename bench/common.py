"""What every scenario shares: the scratch database, worker processes, statistics, tables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from bench import baseline
from bench.app import Base, queue
from sqla_queue.testing.databases import (
    DatabaseFactory,
    normalize_url,
    resolve_test_admin_url,
    url_for_database,
)

__all__ = [
    "COLD_TABLES",
    "PROTOCOLS",
    "ROOT",
    "BackendCpuMeter",
    "BenchDatabase",
    "Summary",
    "TextTable",
    "WorkerProcess",
    "machine_info",
    "percentile",
    "ratio",
    "resolve_server_url",
    "summarize",
]

ROOT = Path(__file__).resolve().parents[1]
DB_PREFIX = "sqlaq_bench_"


def resolve_server_url(explicit: str | None) -> str:
    """The maintenance URL of the server to benchmark on (``--url``, else the test server)."""
    if explicit:
        return normalize_url(explicit)
    return resolve_test_admin_url()


def libpq_dsn(url: str) -> str:
    """A ``postgresql://`` URI of ``url`` for psycopg and asyncpg."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class BenchDatabase:
    """A scratch database with all three contenders' schemas, dropped on exit.

    Its name starts with ``sqlaq_bench_`` and carries the process id; only databases this
    object created are ever dropped.
    """

    def __init__(self, server_url: str, *, keep: bool = False) -> None:
        self.server_url = server_url
        self.keep = keep
        self.name = f"{DB_PREFIX}{os.getpid()}_{secrets.token_hex(3)}"
        self.url = url_for_database(server_url, self.name)
        self.dsn = libpq_dsn(self.url)
        self._factory = DatabaseFactory(server_url)
        self._created = False
        self.engine: Engine | None = None

    def __enter__(self) -> BenchDatabase:
        admin = create_engine(self.server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        finally:
            admin.dispose()
        self._created = True
        self.engine = create_engine(self.url, pool_size=4)
        with self.engine.begin() as conn:
            queue.create_all(conn)
            Base.metadata.create_all(
                conn, tables=[t for t in Base.metadata.sorted_tables if t.schema is None]
            )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(baseline.MIN_DDL)
        asyncio.run(_install_pgqueuer(self.dsn))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            self.engine.dispose()
        if self._created and not self.keep:
            self._factory.drop(self.name)

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit psycopg connection to the scratch database."""
        return psycopg.connect(self.dsn, autocommit=True)

    def fresh_tables(self) -> None:
        """Drop and recreate every contender's tables, then ANALYZE them while empty.

        This is the state both protocols start from: a queue whose statistics were taken by
        autovacuum while it was (nearly) empty. TRUNCATE would not do: neither it nor an
        ANALYZE of the empty table removes the column statistics of an earlier, larger
        table, so a run after a warm one would inherit that run's histograms.

        Autovacuum is switched off on the new tables so that it cannot analyze one of them
        by chance in the middle of a run (a production burst finishes within its naptime
        anyway); :meth:`planner_rows` checks before each clock starts that nothing did.
        """
        assert self.engine is not None
        tables = queue.tables
        # unique_keys is new in schema 4: bench.ab also runs this against older revisions.
        queue_tables = (
            getattr(tables, "unique_keys", None),
            tables.limits,
            tables.executions,
            tables.jobs,
        )
        names = [t.name for t in queue_tables if t is not None]
        with self.connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {', '.join(names)}, bench_min_queue CASCADE")
            # Recreated only before a run of theirs (bench.node_peers): their installers
            # are Node processes.
            conn.execute("DROP SCHEMA IF EXISTS graphile_worker, pgboss CASCADE")
        with self.engine.begin() as conn:
            queue.create_all(conn)
        with self.connect() as conn:
            conn.execute(baseline.MIN_DDL)
        asyncio.run(_install_pgqueuer(self.dsn, reinstall=True))
        with self.connect() as conn:
            for table in COLD_TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
                # The only ANALYZE of the cold protocol: of the empty table.
                conn.execute(f"ANALYZE {table}")

    def settle(self, tables: Sequence[str], protocol: str = "warm") -> None:
        """Prepare ``tables`` for a timed run under ``protocol``, then CHECKPOINT.

        ``warm``: VACUUM ANALYZE each table, so the planner knows the backlog just
        enqueued (the suite's behaviour before the cold protocol). ``cold``: nothing but
        the CHECKPOINT, which analyzes nothing; the statistics stay those of the empty
        tables (see :meth:`fresh_tables`).

        After a checkpoint each first write to a page logs the whole page; running one
        before every timed run makes all of them pay that cost equally.
        """
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; choose from {PROTOCOLS}")
        with self.connect() as conn:
            if protocol == "warm":
                for table in tables:
                    conn.execute(f"VACUUM ANALYZE {table}")
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                conn.execute("CHECKPOINT")

    def planner_rows(self, tables: Sequence[str]) -> dict[str, float]:
        """``pg_class.reltuples`` of ``tables``: what the planner believes they hold.

        Only VACUUM, ANALYZE and CREATE INDEX change it; 0 means the last one ran on the
        empty table (the cold state), -1 that none ever ran.
        """
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT relname::text, reltuples FROM pg_class WHERE relname = ANY(%s)",
                (list(tables),),
            ).fetchall()
        return {str(name): float(n) for name, n in rows}


#: The protocols: ``cold`` (the default: statistics of the empty tables) and ``warm``.
PROTOCOLS = ("cold", "warm")
#: Every contender's tables (recreated and analyzed empty by ``fresh_tables``).
COLD_TABLES = (
    "sqla_queue_jobs",
    "sqla_queue_job_executions",
    "pgqueuer",
    "pgqueuer_log",
    "pgqueuer_statistics",
    "bench_min_queue",
)


async def _install_pgqueuer(dsn: str, *, reinstall: bool = False) -> None:
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if reinstall:
            await queries.uninstall()
        await queries.install()
    finally:
        await conn.close()


# -- worker processes -----------------------------------------------------------------------


class WorkerProcess:
    """One ``python -m bench.worker`` process: it prints READY, waits for GO, then works.

    The start barrier keeps interpreter start-up and imports out of the timed window.
    ``command`` replaces ``python -m bench.worker`` by another program with the same
    contract (a Node worker of :mod:`bench.node_peers`, say); ``args`` follow it.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        command: Sequence[str] | None = None,
    ) -> None:
        # Lives as long as the process object: kill() closes it.
        self._stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [full_env.get("PYTHONPATH")])]
        )
        full_env.update(env or {})
        self.terminated = False
        self.proc = subprocess.Popen(
            [*prefix, *(command or (sys.executable, "-m", "bench.worker")), *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=full_env,
        )

    def wait_ready(self) -> None:
        """Block until the process has finished its set-up."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        while line.startswith("py-spy>") or line == "\n":  # a wrapping profiler talks first
            line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.proc.kill()
            raise RuntimeError(f"worker failed to start: {line!r}\n{self.stderr_tail()}")

    def go(self) -> None:
        """Release the start barrier."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("GO\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the process to exit and return the JSON report it printed last."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise RuntimeError(
                f"worker did not finish in {timeout}s\n{self.stderr_tail()}"
            ) from None
        lines = [x for x in out.splitlines() if x.startswith("{")]
        # A worker that had finished on its own may take the stop signal while it exits,
        # after its report: that is a clean end too.
        stopped = self.terminated and self.proc.returncode == -signal.SIGTERM and lines
        if (self.proc.returncode != 0 and not stopped) or not lines:
            raise RuntimeError(
                f"worker exited with {self.proc.returncode}\n{out}\n{self.stderr_tail()}"
            )
        report: dict[str, Any] = json.loads(lines[-1])
        return report

    def terminate(self) -> None:
        """SIGTERM: a graceful stop."""
        self.terminated = True
        self.proc.terminate()

    def kill(self) -> None:
        """Kill the process if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()

    def stderr_tail(self, chars: int = 3000) -> str:
        """The end of what the process wrote to stderr."""
        self._stderr.seek(0)
        return self._stderr.read()[-chars:]


@contextmanager
def worker_processes(
    args_list: Sequence[Sequence[str]],
    prefixes: Sequence[Sequence[str]] = (),
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
) -> Iterator[list[WorkerProcess]]:
    """Start one process per argument list, wait until all are ready; kill leftovers.

    ``prefixes[i]``, when given, goes before the i-th command (a profiler, say); ``env``
    adds environment variables (``PGOPTIONS``, say); ``command`` replaces
    ``python -m bench.worker`` (see :class:`WorkerProcess`).
    """
    procs = [
        WorkerProcess(
            args, prefix=prefixes[i] if i < len(prefixes) else (), env=env, command=command
        )
        for i, args in enumerate(args_list)
    ]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.kill()


class BackendCpuMeter:
    """CPU time of the server backends serving the scratch database, while it runs.

    A thread lists the database's backends every ``interval`` seconds and reads their CPU
    time from ``/proc``; only possible when the server runs on this machine (otherwise
    :attr:`seconds` stays NaN). A backend's last ``interval`` before it exits is missed.
    """

    def __init__(self, db: BenchDatabase, interval: float = 0.1) -> None:
        self.db = db
        self.interval = interval
        self.seconds = math.nan
        self._base: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="backend-cpu", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def _cpu(self, pid: int) -> float | None:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        # utime and stime are fields 14 and 15 of the line; 12 and 13 after the ")".
        return (int(fields[11]) + int(fields[12])) / self._tick

    def _poll(self, conn: psycopg.Connection[Any], first: bool) -> None:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.db.name,),
        ).fetchall()
        for (pid,) in rows:
            cpu = self._cpu(pid)
            if cpu is None:
                continue
            if pid not in self._base:
                self._base[pid] = cpu if first else 0.0
            self._last[pid] = cpu

    def _run(self) -> None:
        with self.db.connect() as conn:
            while not self._stop.wait(self.interval):
                self._poll(conn, first=False)
            self._poll(conn, first=False)

    def __enter__(self) -> BackendCpuMeter:
        with self.db.connect() as conn:
            self._poll(conn, first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._last and os.path.exists("/proc/self/stat"):
            self.seconds = sum(self._last[p] - self._base[p] for p in self._last)


# -- statistics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Median and spread of repeated measurements."""

    median: float
    low: float
    high: float
    n: int
    values: tuple[float, ...] = field(default=())

    def spread(self) -> float:
        """(max - min) / median, as a fraction."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def as_json(self) -> dict[str, Any]:
        """The summary for the JSON report."""
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "n": self.n,
            "values": list(self.values),
        }


def summarize(values: Sequence[float]) -> Summary:
    """Median, min and max of ``values``."""
    if not values:
        return Summary(math.nan, math.nan, math.nan, 0)
    return Summary(statistics.median(values), min(values), max(values), len(values), tuple(values))


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile ``pct`` (0-100) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def ratio(a: float, b: float) -> float:
    """``a / b``, or NaN when either is missing."""
    if not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def fmt_ratio(value: float) -> str:
    """A ratio as ``1.23x`` (or ``-``)."""
    return "-" if math.isnan(value) else f"{value:.2f}x"


def fmt_rate(s: Summary) -> str:
    """Jobs per second with the spread of the repeats."""
    if s.n == 0:
        return "-"
    if s.n == 1:
        return f"{s.median:,.0f}"
    return f"{s.median:,.0f} ({s.low:,.0f}-{s.high:,.0f})"


class TextTable:
    """A plain-text table that also renders as Markdown for the docs."""

    def __init__(self, title: str, headers: Sequence[str]) -> None:
        self.title = title
        self.headers = list(headers)
        self.rows: list[list[str]] = []
        self.notes: list[str] = []

    def add(self, *cells: object) -> None:
        """Append a row."""
        self.rows.append([str(c) for c in cells])

    def note(self, line: str) -> None:
        """A line printed under the table."""
        self.notes.append(line)

    def render(self) -> str:
        """The table as aligned text."""
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)]
        lines = [self.title, "=" * len(self.title)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(self.headers, widths, strict=False)))
        lines.append("  ".join("-" * w for w in widths))
        for row in self.rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)))
        lines.extend(self.notes)
        return "\n".join(lines)

    def markdown(self) -> str:
        """The table as Markdown."""
        lines = [f"**{self.title}**", ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(self.notes)
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The table for the JSON report."""
        return {"title": self.title, "headers": self.headers, "rows": self.rows}


# -- the machine ----------------------------------------------------------------------------


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def machine_info(db: BenchDatabase) -> dict[str, Any]:
    """CPU, memory, load, and the PostgreSQL version and durability settings."""
    mem_kb = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    settings: dict[str, str] = {}
    with db.connect() as conn:
        version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        for name in ("fsync", "synchronous_commit", "shared_buffers", "wal_level"):
            settings[name] = str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
    import pgqueuer
    import sqlalchemy

    import sqla_queue

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "postgresql": version,
        "settings": settings,
        "load_at_start": load_average(),
        "sqla_queue": sqla_queue.__version__,
        "sqlalchemy": sqlalchemy.__version__,
        "psycopg": psycopg.__version__,
        "pgqueuer": getattr(pgqueuer, "__version__", "?"),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
