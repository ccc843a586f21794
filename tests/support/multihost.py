"""Many hosts: worker processes in network namespaces, one host's link cut mid-run, and
the accounting from records the database itself wrote (issue 17, section 1).

Used by ``tests/acceptance/test_multihost.py`` and ``bench/multihost.py``; the network comes
from :mod:`tests.support.netns`, the PostgreSQL server from :mod:`tests.support.clusters`
(it runs in the server namespace and listens on the bridge's address).

**The queue and the task.** A queue of its own (schema ``multihost``) with one plain
(not ``transactional``) task, :func:`multihost_job`, that does nothing: the worker batches
its completions (``ack_delay``) into its one fenced completion statement, so a worker's
CPU per job is the queue's own, not a session's.

**What the database records** (row triggers, each writing in the transaction of the
statement that fired it, so a record exists exactly when that statement committed):

* ``mh_claims``: each claim, when the claim statement makes an execution ``running``
  (job, attempt, worker id, the claiming connection's address ``inet_client_addr()``,
  hence its host, the lease start ``alive_at``, and ``clock_timestamp()`` at the write);
* ``mh_finishes``: each job's completion, when the completion statement gives the job
  its final status (job, the attempt it records as its last, status, ``finished_at``,
  the completing connection's address, the clock). ``pg_xact_commit_timestamp(xmin)``
  of the row (``track_commit_timestamp = on``) is when that completion committed;
* ``mh_reclaims``: each reclaim, when the sweep hands a lost execution back: the
  execution as it was (attempt, worker id, last heartbeat ``alive_at``, lease), the
  sweep's transaction time (``now()``, what it compared the lease against), the clock.

A job's committed span is its last claim's write to its completion's commit, both on
the database clock. A completion the fence refuses (the execution was reclaimed) changes
no row, so it writes no ``mh_finishes`` row.

**Worker processes.** ``python -m tests.support.multihost --url ... --host h0 ...`` run
under ``ip netns exec <namespace>``: it connects over TCP to the server's bridge address,
says it is ready, waits at a start barrier (a file), runs a sync worker until SIGTERM and
writes its ``RunStats`` and worker id as JSON.

**The run** (:func:`run_multihost`): enqueue the jobs, start the workers, release them;
when a fraction of the jobs is done, take one host's link down; keep it down until every
execution that host's workers held has been reclaimed (and at least one lease); bring it
back; drain; SIGTERM everyone. :func:`verify_multihost` then checks the records and logs
(see its docstring).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import faulthandler
import functools
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Double,
    Engine,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    create_engine,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import INET
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from sqla_queue import Queue, RetryPolicy
from tests.support.clusters import TemporaryCluster, new_cluster_root
from tests.support.netns import DB_ADDRESS, PREFIX, SUBNET, Host, Topology

__all__ = [
    "LEASE",
    "RECORDS",
    "TASK",
    "Environment",
    "MultihostConfig",
    "MultihostReport",
    "MultihostRun",
    "create_schema",
    "environment",
    "metadata",
    "queue",
    "run_multihost",
    "summary",
    "verify_multihost",
]

ROOT = Path(__file__).resolve().parents[2]
TASK = "multihost_job"
#: The task's lost interval (lease), seconds: short, so that a cut host's jobs come back
#: quickly. Workers heartbeat every quarter of it and sweep every half.
LEASE = 3.0
#: The server's settings for these runs: no fsync (a test cluster), the commit time of
#: each transaction kept (a span's end), room for 8 workers' connections, and dead peers
#: detected within seconds. That last part is what makes a cut host's jobs come back
#: after their lease: a transaction the host had open when its link went down (a
#: heartbeat between its UPDATE and its COMMIT, a completion awaiting its COMMIT) keeps
#: its row locks for as long as the server keeps the session, and the reclaim sweep
#: skips locked rows. With PostgreSQL's defaults (the kernel's keepalive, two hours)
#: those jobs would wait for the link to come back. Keepalive probes are answered by the
#: peer's kernel, so a busy but reachable worker is never cut off.
SERVER_SETTINGS = {
    "tcp_keepalives_idle": "1",
    "tcp_keepalives_interval": "1",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "4000",
    "max_connections": "400",
    "track_commit_timestamp": "on",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    # Fewer checkpoints and background flushes during a drain (a throwaway cluster).
    "max_wal_size": "4GB",
    "checkpoint_timeout": "30min",
    "autovacuum_vacuum_cost_delay": "0",
}

metadata = MetaData()
queue = Queue(metadata=metadata, schema="multihost", lost_interval=LEASE)

claims = Table(
    "mh_claims",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", Uuid, nullable=False),
    Column("client_addr", INET),
    Column("alive_at", DateTime(timezone=True), nullable=False),
    Column("logged_at", DateTime(timezone=True), nullable=False),
)
finishes = Table(
    "mh_finishes",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("client_addr", INET),
    Column("logged_at", DateTime(timezone=True), nullable=False),
)
reclaims = Table(
    "mh_reclaims",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", Uuid),
    Column("alive_at", DateTime(timezone=True)),
    Column("lease_seconds", Double),
    Column("swept_at", DateTime(timezone=True), nullable=False),
    Column("logged_at", DateTime(timezone=True), nullable=False),
)
#: Every this many jobs, one sleeps :data:`LONG_SECONDS` (the rest do nothing). The link
#: is cut while the cut host runs one of them, so a handler of it is sure to finish
#: after the cut, while its lease is lost: its completion, sent after link-up, must be
#: refused. (Without that, a host whose handlers take no time may hold only executions
#: it has not received yet, or acknowledgements in flight, when its link goes down.)
LONG_EVERY = 500
LONG_SECONDS = 1.5
#: The tables the triggers write (emptied between a bench's drains).
RECORDS = (claims, finishes, reclaims)


@queue.task(
    name=TASK,
    lost_interval=LEASE,
    # A cut link loses running jobs (and may fail attempts): room for many.
    max_attempts=1_000,
    max_reclaims=1_000,
    retry=RetryPolicy(min_delay=0.05, max_delay=0.5, factor=2.0, jitter=0.25),
)
def multihost_job(n: int) -> int:
    """Nothing (every :data:`LONG_EVERY`-th job sleeps :data:`LONG_SECONDS`): the database
    records the claim and the completion (see the module doc)."""
    if n % LONG_EVERY == 0:
        time.sleep(LONG_SECONDS)
    return n


def _trigger_ddl() -> list[str]:
    """The claim, completion and reclaim logs' triggers on the queue's tables."""
    ex = queue.tables.executions.fullname
    jobs = queue.tables.jobs.fullname
    return [
        """
        CREATE FUNCTION mh_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO mh_claims (job_id, attempt, worker_id, client_addr, alive_at, logged_at)
            VALUES (NEW.id, NEW.attempt, NEW.worker_id, inet_client_addr(), NEW.alive_at,
                    clock_timestamp());
            RETURN NULL;
        END $$
        """,
        f"""
        CREATE TRIGGER mh_claim AFTER UPDATE OF state ON {ex}
        FOR EACH ROW WHEN (NEW.state = 'running' AND OLD.state <> 'running')
        EXECUTE FUNCTION mh_claim_log()
        """,
        """
        CREATE FUNCTION mh_finish_log() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO mh_finishes
                (job_id, attempt, status, finished_at, client_addr, logged_at)
            VALUES (NEW.id, NEW.attempts, NEW.status, NEW.finished_at, inet_client_addr(),
                    clock_timestamp());
            RETURN NULL;
        END $$
        """,
        # Every update that leaves the job in a final status is logged, not only the
        # first: a second completion of a job would show as a second row.
        f"""
        CREATE TRIGGER mh_finish AFTER UPDATE OF status ON {jobs}
        FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled'))
        EXECUTE FUNCTION mh_finish_log()
        """,
        """
        CREATE FUNCTION mh_reclaim_log() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO mh_reclaims
                (job_id, attempt, worker_id, alive_at, lease_seconds, swept_at, logged_at)
            VALUES (OLD.id, OLD.attempt, OLD.worker_id, OLD.alive_at, OLD.lease_seconds,
                    now(), clock_timestamp());
            RETURN NULL;
        END $$
        """,
        f"""
        CREATE TRIGGER mh_reclaim AFTER UPDATE OF reclaims ON {ex}
        FOR EACH ROW WHEN (NEW.reclaims > OLD.reclaims)
        EXECUTE FUNCTION mh_reclaim_log()
        """,
    ]


def create_schema(engine: Engine) -> None:
    """The queue's tables, the record tables and their triggers."""
    with engine.begin() as connection:
        queue.create_all(connection)
        metadata.create_all(connection, tables=list(RECORDS))
        for statement in _trigger_ddl():
            connection.execute(text(statement))


def enqueue_jobs(engine: Engine, jobs: int, chunk: int = 20_000) -> list[int]:
    """Enqueue ``jobs`` jobs of :data:`TASK` (``n`` = 0, 1, ...), ``chunk`` per
    transaction; returns their ids, in order."""
    task = queue.get_task(TASK)
    ids: list[int] = []
    while len(ids) < jobs:
        done, size = len(ids), min(chunk, jobs - len(ids))
        with Session(engine) as session, session.begin():
            ids += queue.enqueue_many(session, (task.call(n=done + i) for i in range(size)))
    return ids


# -- the environment: namespaces, server, database ------------------------------------------

#: The server's port (inside its own namespace: nothing else listens there).
PORT = 55432
DATABASE = "multihost"


@dataclass(frozen=True)
class Environment:
    """The network, the server in its namespace, and the two ways to reach its database."""

    topology: Topology
    cluster: TemporaryCluster
    #: Through the server's unix socket: for the test process (root namespace).
    admin_url: str
    #: Through the bridge address: for the worker processes in the host namespaces.
    host_url: str


def _remove_stale_roots() -> None:
    """Delete cluster directories a crashed run left (their servers died with the
    namespace's processes)."""
    for stale in Path(tempfile.gettempdir()).glob(f"{PREFIX}pg-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def environment(hosts: int, *, say: Callable[[str], None] | None = None) -> Iterator[Environment]:
    """Namespaces for ``hosts`` hosts, a fresh server in the server namespace listening on
    the bridge address, and a database with the queue's schema; all gone at the end."""
    with Topology.create(hosts, say=say) as topology:
        _remove_stale_roots()
        root = new_cluster_root(prefix=f"{PREFIX}pg-")
        try:
            cluster = TemporaryCluster.create(
                root,
                port=PORT,
                listen_addresses=DB_ADDRESS,
                settings=SERVER_SETTINGS,
                hba_lines=[f"host all all {SUBNET}.0/24 trust"],
            )
            with cluster:
                cluster.start(topology.db_wrapper)
                cluster.execute_sql(f"CREATE DATABASE {DATABASE}")
                admin_url = cluster.url(DATABASE, host="")
                engine = create_engine(admin_url, poolclass=NullPool)
                try:
                    create_schema(engine)
                finally:
                    engine.dispose()
                yield Environment(topology, cluster, admin_url, cluster.url(DATABASE))
        finally:
            shutil.rmtree(root, ignore_errors=True)


# -- the worker process ---------------------------------------------------------------------


def worker_main(argv: Sequence[str] | None = None) -> int:
    """One worker process: connect, say ready, wait for the start barrier, run until
    SIGTERM, write the run's stats and worker id as JSON to ``--report``."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.multihost")
    parser.add_argument("--url", required=True, help="the server, by its bridge address")
    parser.add_argument("--host", required=True, help="this simulated host's name")
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--ack-delay", type=float, default=0.005)
    parser.add_argument("--ready", type=Path, required=True, help="written once connected")
    parser.add_argument(
        "--go", type=Path, required=True, help="the start barrier: run once it exists"
    )
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--start-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    # A worker that does not stop gets SIGUSR1 first: its threads' stacks go to its log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    engine = create_engine(
        args.url,
        pool_size=args.concurrency + 4,
        max_overflow=args.concurrency,
        connect_args={
            # A new connection over a cut link fails instead of hanging.
            "connect_timeout": 10,
            # And so does one open at the cut: without keepalives, a connection waiting
            # for a reply the cut lost (the server dropped the session meanwhile) waits
            # forever, and its worker never stops.
            "keepalives": 1,
            "keepalives_idle": 1,
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": 4000,
        },
    )
    deadline = time.monotonic() + args.start_timeout
    while True:
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            break
        except Exception as exc:
            if time.monotonic() >= deadline:
                print(f"cannot reach the server at {args.url}: {exc}", file=sys.stderr)
                return 2
            time.sleep(0.2)
    # Open the handlers' connections now, not in a storm when the run starts (on a small
    # machine, a storm of connections stalls heartbeats past the lease).
    held = [engine.connect() for _ in range(args.concurrency + 2)]
    for connection in held:
        connection.close()
    args.ready.write_text(str(os.getpid()))
    while not args.go.exists():
        if time.monotonic() >= deadline:
            print("no start signal", file=sys.stderr)
            return 2
        time.sleep(0.01)
    worker = queue.worker(
        sessionmaker(engine),
        concurrency=args.concurrency,
        batch_size=args.batch,
        poll_interval=args.poll_interval,
        ack_delay=args.ack_delay,
        tasks=[TASK],
        shutdown_timeout=15.0,
    )
    stats = worker.run()
    assert worker.decider is not None
    report = {
        "host": args.host,
        "pid": os.getpid(),
        "worker_id": str(worker.decider.worker_id),
        **asdict(stats),
    }
    args.report.write_text(json.dumps(report))
    engine.dispose()
    return 0


# -- the run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultihostConfig:
    """Sizes and rhythm of one run."""

    jobs: int = 100_000
    #: Hosts used (the first ones of the topology) and worker processes on each.
    hosts: int = 4
    workers_per_host: int = 2
    concurrency: int = 24
    batch: int = 24
    poll_interval: float = 0.05
    #: Longest a finished job's acknowledgement waits to share a statement with others.
    ack_delay: float = 0.005
    #: Take a host's link down once this fraction of the jobs is done (None: never).
    cut_at: float | None = 0.3
    #: Index of the host whose link is cut.
    cut_host: int = 1
    #: Longest the link stays down, seconds (it comes back as soon as every execution the
    #: host's workers held has been reclaimed, and at least one lease has passed).
    max_hold: float = 30.0
    drain_timeout: float = 300.0
    start_timeout: float = 90.0
    stop_timeout: float = 30.0


@dataclass
class WorkerProc:
    """One worker process in a host namespace."""

    host: str
    slot: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    ready_path: Path
    report_path: Path
    returncode: int | None = None
    #: Exited before the orchestrator stopped it.
    exited_early: bool = False
    killed: bool = False
    report: dict[str, Any] | None = None

    @property
    def worker_id(self) -> uuid.UUID | None:
        """The worker id it reported at exit."""
        return uuid.UUID(self.report["worker_id"]) if self.report else None

    def log(self) -> str:
        """Its output so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def fenced_outcomes(self) -> list[tuple[int, int]]:
        """(job, attempt) of each completion the fence refused, from its log."""
        return [(int(j), int(a)) for j, a in _FENCED.findall(self.log())]


_FENCED = re.compile(r"job (\d+) attempt (\d+): result discarded")


@dataclass
class Cut:
    """The link cut: when, which host, and what the orchestrator saw."""

    host: str
    #: The host's address (what ``inet_client_addr()`` records for its connections).
    address: str
    #: The host's worker ids known at the cut (from the claims its address made).
    worker_ids: set[uuid.UUID]
    done_at_cut: int
    down_at: dt.datetime
    up_at: dt.datetime | None = None
    held_seconds: float = 0.0
    #: Executions its workers still held when the link came back (0 unless max_hold ran out).
    held_at_up: int = 0
    left_at_up: int = 0
    #: Seconds from link-up to the host's first committed completion after it.
    resumed_after: float | None = None


@dataclass
class MultihostRun:
    """What :func:`run_multihost` did."""

    config: MultihostConfig
    total: int = 0
    workers: list[WorkerProc] = field(default_factory=list)
    cut: Cut | None = None
    released_at: dt.datetime | None = None
    drain_seconds: float | None = None
    #: Ids of the jobs that sleep (see :data:`LONG_EVERY`).
    long_ids: list[int] = field(default_factory=list)
    #: Host name of each host address (the records' ``client_addr``).
    addresses: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    def workers_of(self, host: str) -> list[WorkerProc]:
        """The worker processes of ``host``."""
        return [w for w in self.workers if w.host == host]


def _db_now(admin: Connection) -> dt.datetime:
    now: dt.datetime = admin.execute(select(func.clock_timestamp())).scalar_one()
    return now


def _settle(
    admin: Connection, address: str, unread: Callable[[], int], timeout: float = 10.0
) -> None:
    """Wait (boundedly) until no server session of ``address`` is running a statement and
    the server's sockets hold no unread byte of it, twice in a row: what the host sent
    before its link went down has been processed, so the cut's time read next is after
    everything the host could still do. (Sessions alone are not enough: on a loaded
    machine a backend not yet scheduled looks idle while the host's last pipeline waits
    in its socket, and it runs that pipeline after the cut's time was read.)"""
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 2 and time.monotonic() < deadline:
        busy = admin.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE client_addr = CAST(:address AS inet) AND state = 'active'"
            ),
            {"address": address},
        ).scalar_one()
        quiet = quiet + 1 if busy == 0 and unread() == 0 else 0
        time.sleep(0.05)


def _running_long(admin: Connection, address: str, long_ids: list[int]) -> bool:
    """Whether a worker at ``address`` runs one of the long jobs, claimed (on the database
    clock) long enough ago for the claim's reply to have arrived, and recently enough for
    its handler to run on well after a cut now."""
    ex = queue.tables.executions.fullname
    return bool(
        admin.execute(
            text(
                f"SELECT EXISTS (SELECT FROM {ex} e JOIN mh_claims c ON c.job_id = e.id "
                "AND c.attempt = e.attempt AND c.worker_id = e.worker_id "
                "WHERE e.state = 'running' AND e.id = ANY(:ids) "
                "AND c.client_addr = CAST(:address AS inet) "
                "AND c.logged_at BETWEEN clock_timestamp() - interval '900 ms' "
                "AND clock_timestamp() - interval '300 ms')"
            ),
            {"ids": long_ids, "address": address},
        ).scalar_one()
    )


def _left(admin: Connection) -> int:
    ex = queue.tables.executions
    return int(admin.execute(select(func.count()).select_from(ex)).scalar_one())


def start_workers(
    hosts: Sequence[Host],
    per_host: int,
    url: str,
    config: MultihostConfig,
    log_dir: Path,
) -> list[WorkerProc]:
    """Start ``per_host`` worker processes in each host's namespace (not yet released)."""
    procs: list[WorkerProc] = []
    go = log_dir / "go"
    for host in hosts:
        for slot in range(per_host):
            stem = log_dir / f"{host.name}-{slot}"
            log_path = stem.with_suffix(".log")
            argv = [
                sys.executable,
                "-m",
                "tests.support.multihost",
                "--url",
                url,
                "--host",
                host.name,
                "--concurrency",
                str(config.concurrency),
                "--batch",
                str(config.batch),
                "--poll-interval",
                str(config.poll_interval),
                "--ack-delay",
                str(config.ack_delay),
                "--ready",
                str(stem.with_suffix(".ready")),
                "--go",
                str(go),
                "--report",
                str(stem.with_suffix(".json")),
                "--start-timeout",
                str(config.start_timeout),
            ]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            with open(log_path, "ab") as out:
                popen = subprocess.Popen(
                    host.command(argv), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                )
            procs.append(
                WorkerProc(
                    host.name,
                    slot,
                    popen,
                    log_path,
                    stem.with_suffix(".ready"),
                    stem.with_suffix(".json"),
                )
            )
    return procs


def _wait_ready(procs: list[WorkerProc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.ready_path.exists() for p in procs):
        for p in procs:
            if p.popen.poll() is not None:
                raise RuntimeError(
                    f"worker {p.host}-{p.slot} exited with {p.popen.returncode} before it "
                    f"was ready:\n{p.log()[-2000:]}"
                )
        if time.monotonic() >= deadline:
            missing = [f"{p.host}-{p.slot}" for p in procs if not p.ready_path.exists()]
            raise RuntimeError(f"workers not ready within {timeout:.0f}s: {missing}")
        time.sleep(0.05)


def stop_workers(procs: list[WorkerProc], timeout: float) -> None:
    """SIGTERM the workers still running, wait (boundedly), SIGKILL what is left; read
    each one's report."""
    for p in procs:
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGUSR1)  # its stacks, into its log
            time.sleep(1.0)
            p.popen.kill()
            p.popen.wait(10)
            p.killed = True
        p.returncode = p.popen.returncode
        if p.report_path.exists():
            with contextlib.suppress(ValueError):
                p.report = json.loads(p.report_path.read_text())


def kill_workers(procs: list[WorkerProc]) -> None:
    """SIGKILL every worker still running (after a failure)."""
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
            p.killed = True
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(10)


def run_multihost(
    topology: Topology,
    admin: Engine,
    host_url: str,
    config: MultihostConfig,
    log_dir: Path,
    *,
    say: Callable[[str], None] = lambda _m: None,
) -> MultihostRun:
    """Enqueue, start the workers in their namespaces, release them, cut a link (if
    ``config.cut_at``), drain, stop. ``admin`` reaches the server over its unix socket;
    ``host_url`` is what the workers use (the bridge address)."""
    run = MultihostRun(config=config)
    began = time.monotonic()
    hosts = topology.hosts[: config.hosts]
    run.addresses = {h.address: h.name for h in topology.hosts}
    # The workers start (import, connect) while the jobs are enqueued; they wait at the
    # start barrier.
    run.workers = start_workers(hosts, config.workers_per_host, host_url, config, log_dir)
    try:
        ids = enqueue_jobs(admin, config.jobs)
        run.total, run.long_ids = len(ids), ids[::LONG_EVERY]
        say(f"enqueued {run.total} jobs in {time.monotonic() - began:.1f}s")
        _wait_ready(run.workers, config.start_timeout)
        say(f"workers ready after {time.monotonic() - began:.1f}s")
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            run.released_at = _db_now(conn)
            (log_dir / "go").touch()
            _drive(run, topology, conn, hosts, say)
    except BaseException:
        kill_workers(run.workers)
        raise
    stop_workers(run.workers, config.stop_timeout)
    return run


def _drive(
    run: MultihostRun,
    topology: Topology,
    admin: Connection,
    hosts: Sequence[Host],
    say: Callable[[str], None],
) -> None:
    config = run.config
    started = time.monotonic()
    deadline = started + config.drain_timeout
    last_report = started
    down_since = up_since = 0.0
    #: When the cut fell due (it then waits for the host to be running a long job).
    cut_wait: float | None = None
    cut_host = hosts[config.cut_host] if config.cut_at is not None else None
    ex = queue.tables.executions

    def note(message: str) -> None:
        run.events.append(f"[{time.monotonic() - started:6.1f}s] {message}")
        say(run.events[-1])

    while True:
        now = time.monotonic()
        left = _left(admin)
        done = run.total - left
        cutting = run.cut is not None and run.cut.up_at is None
        if left == 0 and run.drain_seconds is None:
            run.drain_seconds = now - started
            note(f"drained {run.total} jobs in {run.drain_seconds:.1f}s")
        if left == 0 and not cutting:
            # (A small run may drain while the link is still down: bring it back first.)
            break
        if now >= deadline:
            note(f"timeout: {left} jobs left after {config.drain_timeout:.0f}s")
            break
        for p in run.workers:
            if not p.exited_early and p.popen.poll() is not None:
                p.exited_early = True
                note(f"worker {p.host}-{p.slot} exited on its own ({p.popen.returncode})")
        cut = run.cut
        due = cut_host is not None and done >= config.cut_at * run.total  # type: ignore[operator]
        if due and cut is None and cut_wait is None:
            cut_wait = now
        if (
            cut_host is not None
            and cut is None
            and cut_wait is not None
            and (_running_long(admin, cut_host.address, run.long_ids) or now - cut_wait > 10)
        ):
            ids = set(
                admin.execute(
                    select(claims.c.worker_id)
                    .where(claims.c.client_addr == cut_host.address)
                    .distinct()
                ).scalars()
            )
            topology.cut(cut_host)
            down_since = time.monotonic()
            _settle(admin, cut_host.address, functools.partial(topology.unread_bytes, cut_host))
            run.cut = Cut(cut_host.name, cut_host.address, ids, done, _db_now(admin))
            note(f"link of {cut_host.name} down at {done}/{run.total} ({len(ids)} workers known)")
        elif cut is not None and cut.up_at is None:
            held = admin.execute(
                select(func.count())
                .select_from(ex)
                .where(ex.c.state == "running", ex.c.worker_id.in_(cut.worker_ids))
            ).scalar_one()
            waited = now - down_since
            if (waited >= LEASE and held == 0) or waited >= config.max_hold:
                assert cut_host is not None
                topology.restore(cut_host)
                up_since = time.monotonic()
                cut.up_at = _db_now(admin)
                cut.held_seconds = up_since - down_since
                cut.held_at_up, cut.left_at_up = int(held), left
                note(
                    f"link of {cut.host} up after {cut.held_seconds:.1f}s "
                    f"({held} executions still held by it, {left} jobs left)"
                )
        elif cut is not None and cut.resumed_after is None and cut.up_at is not None:
            back = admin.execute(
                select(finishes.c.id)
                .where(finishes.c.client_addr == cut.address, finishes.c.logged_at > cut.up_at)
                .limit(1)
            ).first()
            if back:
                cut.resumed_after = now - up_since
                note(f"{cut.host} committed again {cut.resumed_after:.1f}s after link-up")
        if now - last_report >= 10:
            last_report = now
            note(f"{done}/{run.total} done")
        # Each poll counts the backlog: not too often, it competes with the workers.
        if run.cut is None and cut_wait is not None:
            time.sleep(0.05)
        else:
            time.sleep(0.25 if run.cut is not None and run.cut.up_at is None else 0.5)


# -- the accounting -------------------------------------------------------------------------


@dataclass
class MultihostReport:
    """What the database and the workers' reports say; ``problems`` is empty when every
    check of :func:`verify_multihost` holds."""

    jobs: int = 0
    succeeded: int = 0
    #: Committed completions (``mh_finishes`` rows) and claims (``mh_claims`` rows).
    spans: int = 0
    claims: int = 0
    spans_by_host: Counter[str] = field(default_factory=Counter)
    rerun_jobs: int = 0
    failed_attempts: int = 0
    reclaims: int = 0
    reclaims_of_cut: int = 0
    fenced_by_cut: int = 0
    fenced_elsewhere: int = 0
    fenced_matched: int = 0
    #: Refused re-sends of completions that had committed at the cut (reply lost).
    fenced_acked_before: int = 0
    #: Claims of the cut host the server wrote after the cut (never received by it).
    claims_during_cut: int = 0
    #: Seconds from the cut to the last reclaim of the cut host's executions.
    recovery_seconds: float | None = None
    #: From the start barrier to the last commit, seconds (database clock).
    drain_seconds: float | None = None
    #: Milliseconds from a job's last claim to its completion's commit.
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def jobs_per_second(self) -> float | None:
        """Jobs over the drain's database-clock duration."""
        if not self.drain_seconds:
            return None
        return self.jobs / self.drain_seconds

    def problem(self, message: str) -> None:
        """Note one failed check."""
        self.problems.append(message)


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def verify_multihost(engine: Engine, run: MultihostRun) -> MultihostReport:
    """Check the run against the database's claim, completion and reclaim logs, and the
    workers' reports.

    For every job (``jobs`` of them, none missing):

    1. it ``succeeded`` and has exactly one completion record: one committed completion,
       of the attempt the job records as its last, which is its last claimed attempt, and
       it came from the address (host) whose worker claimed that attempt;
    2. every attempt was claimed once, and every claimed attempt but the last is
       accounted for: the reclaim log took it from the very worker that claimed it (after
       that claim), or it failed (its error is in the job's history);
    3. every reclaim happened after the lease ran out: ``alive_at + lease < swept_at``
       (the sweep transaction's own time, what it compared against);
    4. every claim was written after every reclaim of the job's earlier attempts, and
       the committed attempt was never reclaimed: a job's leases (claim to reclaim, or
       claim to completion) never overlap, so two workers never held a job's lease at
       once, and the only execution whose completion committed held a live lease. (A
       stale handler of the cut host may still run after its lease is gone; item 1 and
       the fence checks below show its completion committed nothing.)

    Every claim's worker is one of the run's workers, and each worker claimed only from
    its own host's address. With a cut: the cut host's executions were reclaimed (at
    least one), each after its last heartbeat before the cut plus the lease and before
    the link came back; its workers' completions of those were refused (at least one
    fenced outcome, and each one in their logs names a (job, attempt) the reclaim log took
    from that very worker); no claim or completion came from the cut host while its link
    was down; it completed jobs again afterwards. Every worker ran until SIGTERM and
    exited 0.
    """
    report = MultihostReport(jobs=run.total)
    jobs_t = queue.tables.jobs
    ex = queue.tables.executions
    committed_at = func.pg_xact_commit_timestamp(text("mh_finishes.xmin"))
    with engine.connect() as conn:
        jobs = {
            row.id: row
            for row in conn.execute(
                select(jobs_t.c.id, jobs_t.c.status, jobs_t.c.attempts, jobs_t.c.errors).where(
                    jobs_t.c.task == TASK
                )
            )
        }
        claim_rows = conn.execute(
            select(
                claims.c.job_id,
                claims.c.attempt,
                claims.c.worker_id,
                claims.c.client_addr,
                claims.c.logged_at,
            )
        ).all()
        finish_rows = conn.execute(
            select(
                finishes.c.job_id,
                finishes.c.attempt,
                finishes.c.status,
                finishes.c.client_addr,
                finishes.c.logged_at,
                committed_at.label("committed_at"),
            )
        ).all()
        reclaim_rows = conn.execute(select(reclaims)).all()
        leftover = conn.execute(select(func.count()).select_from(ex)).scalar_one()

    hosts_by_address = run.addresses
    if leftover:
        report.problem(f"{leftover} executions still in the queue")
    if len(jobs) != run.total:
        report.problem(f"{len(jobs)} jobs in the table, {run.total} enqueued")
    examples: Counter[str] = Counter()

    def bad(kind: str, message: str) -> None:
        examples[kind] += 1
        if examples[kind] <= 5:
            report.problem(message)

    claimed: dict[int, dict[int, Any]] = defaultdict(dict)
    addresses_of: dict[uuid.UUID, set[str]] = defaultdict(set)
    for c in claim_rows:
        addresses_of[c.worker_id].add(str(c.client_addr))
        if c.attempt in claimed[c.job_id]:
            bad("twice", f"job {c.job_id}: attempt {c.attempt} claimed twice")
        claimed[c.job_id][c.attempt] = c
    report.claims = len(claim_rows)
    finished: dict[int, list[Any]] = defaultdict(list)
    for f in finish_rows:
        finished[f.job_id].append(f)
        report.spans_by_host[hosts_by_address.get(str(f.client_addr), str(f.client_addr))] += 1
    report.spans = len(finish_rows)
    reclaimed: dict[int, list[Any]] = defaultdict(list)
    for r in reclaim_rows:
        reclaimed[r.job_id].append(r)
        lease = dt.timedelta(seconds=r.lease_seconds or 0.0)
        if r.alive_at is None or not r.alive_at + lease < r.swept_at:
            bad("early", f"job {r.job_id} attempt {r.attempt} reclaimed within its lease: {r}")
    report.reclaims = len(reclaim_rows)

    latencies: list[float] = []
    for job_id, job in jobs.items():
        if job.status != "succeeded":
            bad("status", f"job {job_id}: status {job.status}")
        else:
            report.succeeded += 1
        done = finished.get(job_id, [])
        if len(done) != 1:
            bad("count", f"job {job_id}: {len(done)} committed completions")
            continue
        end = done[0]
        attempts = claimed.get(job_id, {})
        if end.status != "succeeded" or end.attempt != job.attempts:
            bad("attempt", f"job {job_id}: completion {end}, job at attempt {job.attempts}")
        last = attempts.get(end.attempt)
        if last is None or end.attempt != max(attempts):
            bad(
                "unclaimed",
                f"job {job_id}: completed attempt {end.attempt}, claimed {sorted(attempts)}",
            )
            continue
        if end.client_addr != last.client_addr:
            bad(
                "elsewhere",
                f"job {job_id}: attempt {end.attempt} claimed from {last.client_addr}, "
                f"completed from {end.client_addr}",
            )
        if end.committed_at is not None:
            latencies.append((end.committed_at - last.logged_at).total_seconds() * 1000)
        errors = job.errors or []
        report.failed_attempts += len(errors)
        if end.attempt > 1:
            report.rerun_jobs += 1
        lost = reclaimed.get(job_id, [])
        taken = {(r.attempt, r.worker_id) for r in lost}
        failed = {e.get("attempt") for e in errors}
        for attempt, c in attempts.items():
            explained = (attempt, c.worker_id) in taken or attempt in failed
            if attempt != end.attempt and not explained:
                bad(
                    "unexplained",
                    f"job {job_id}: attempt {attempt} of {c.worker_id} neither "
                    "reclaimed from it nor failed",
                )
        for r in lost:
            if r.attempt >= end.attempt:
                bad("late", f"job {job_id}: committed attempt {end.attempt} was reclaimed: {r}")
            mine = attempts.get(r.attempt)
            if mine is None or mine.worker_id != r.worker_id or not mine.logged_at < r.logged_at:
                bad("stranger", f"job {job_id}: reclaim {r} of no claim {mine}")
            for c in attempts.values():
                if c.attempt > r.attempt and not c.logged_at > r.logged_at:
                    bad(
                        "overlap",
                        f"job {job_id}: attempt {c.attempt} claimed at {c.logged_at}, "
                        f"before the reclaim of attempt {r.attempt} at {r.logged_at}",
                    )
    strays = (set(finished) | set(claimed)) - set(jobs)
    if strays:
        report.problem(f"records of {len(strays)} unknown jobs")
    for kind, n in examples.items():
        if n > 5:
            report.problem(f"... {n - 5} more of kind {kind!r}")

    if latencies:
        report.latency_p50_ms = _percentile(latencies, 50)
        report.latency_p99_ms = _percentile(latencies, 99)
    commits = [f.committed_at for f in finish_rows if f.committed_at is not None]
    if commits and run.released_at is not None:
        report.drain_seconds = (max(commits) - run.released_at).total_seconds()

    hosts = {w.host for w in run.workers}
    for host in sorted(hosts - set(report.spans_by_host)):
        report.problem(f"host {host} committed nothing")
    address_of_host = {name: address for address, name in hosts_by_address.items()}
    for w in run.workers:
        name = f"worker {w.host}-{w.slot}"
        if w.exited_early:
            report.problem(f"{name} exited on its own ({w.returncode}):\n{w.log()[-1500:]}")
        elif w.returncode != 0 or w.killed:
            report.problem(f"{name} exited with {w.returncode} after SIGTERM:\n{w.log()[-1500:]}")
        wid = w.worker_id
        if wid is None:
            report.problem(f"{name} wrote no report")
        elif addresses_of.get(wid, set()) - {address_of_host.get(w.host)}:
            report.problem(f"{name} claimed from {addresses_of[wid]}")
    strangers = set(addresses_of) - {w.worker_id for w in run.workers}
    if strangers and all(w.report is not None for w in run.workers):
        report.problem(f"claims by workers not of this run: {strangers}")
    _check_cut(report, run, reclaim_rows, claimed, finished)
    return report


def _check_cut(
    report: MultihostReport,
    run: MultihostRun,
    reclaim_rows: Sequence[Any],
    claimed: dict[int, dict[int, Any]],
    finished: dict[int, list[Any]],
) -> None:
    cut = run.cut
    if run.config.cut_at is None:
        return
    if cut is None or cut.up_at is None:
        report.problem("the link was never cut, or never came back")
        return
    cut_workers = run.workers_of(cut.host)
    ids = set(cut.worker_ids) | {w.worker_id for w in cut_workers if w.worker_id}
    unknown = {w.worker_id for w in cut_workers if w.worker_id} - cut.worker_ids
    if unknown:
        report.problem(f"cut host workers {unknown} had claimed nothing before the cut")
    of_cut = [r for r in reclaim_rows if r.worker_id in ids]
    report.reclaims_of_cut = len(of_cut)
    if not of_cut:
        report.problem("no execution of the cut host was reclaimed")
    if cut.held_at_up:
        report.problem(f"{cut.held_at_up} executions still held by the cut host at link-up")
    for r in of_cut:
        if r.alive_at is None or r.alive_at > cut.down_at or r.logged_at > cut.up_at:
            report.problem(
                f"reclaim of the cut host's job {r.job_id} outside the cut "
                f"({cut.down_at} - {cut.up_at}): {r}"
            )
    if of_cut:
        report.recovery_seconds = max((r.logged_at - cut.down_at).total_seconds() for r in of_cut)
    report.fenced_by_cut = sum(int(w.report.get("fenced", 0)) for w in cut_workers if w.report)
    report.fenced_elsewhere = sum(
        int(w.report.get("fenced", 0)) for w in run.workers if w.report and w.host != cut.host
    )
    if report.fenced_by_cut == 0:
        report.problem("the cut host's workers reported no fenced (refused) completion")
    taken = {(r.job_id, r.attempt, r.worker_id) for r in of_cut}

    def committed(job_id: int, attempt: int, worker_id: uuid.UUID | None) -> bool:
        """The job's one committed completion is this attempt, claimed by this worker."""
        done = finished.get(job_id, [])
        mine = claimed.get(job_id, {}).get(attempt)
        return (
            len(done) == 1
            and done[0].attempt == attempt
            and mine is not None
            and mine.worker_id == worker_id
        )

    for w in cut_workers:
        for job_id, attempt in w.fenced_outcomes():
            if (job_id, attempt, w.worker_id) in taken:
                report.fenced_matched += 1
            elif committed(job_id, attempt, w.worker_id):
                # Its completion committed at the cut, but the reply was lost; the worker
                # sent it again after link-up and found the execution already gone.
                report.fenced_acked_before += 1
            else:
                report.problem(
                    f"worker {w.host}-{w.slot} had job {job_id} attempt {attempt} fenced, "
                    "but the reclaim log has no such reclaim of its execution"
                )
    address = ipaddress.ip_address(cut.address)

    def of_host_during(row: Any) -> bool:
        return bool(
            ipaddress.ip_address(str(row.client_addr)) == address
            and cut.down_at < row.logged_at < cut.up_at
        )

    finished_during = [f for rows in finished.values() for f in rows if of_host_during(f)]
    if finished_during:
        report.problem(
            f"{len(finished_during)} completions of the cut host committed while its link "
            f"was down: {finished_during[:3]}"
        )
    # A claim the host sent just before the cut may be written after it (the server was
    # behind); the host never got its reply, so it must have been reclaimed from it.
    for attempts in claimed.values():
        for c in attempts.values():
            if of_host_during(c):
                report.claims_during_cut += 1
                if (c.job_id, c.attempt, c.worker_id) not in taken:
                    report.problem(f"claim {c} of the cut host, while its link was down, kept")
    after = sum(
        1
        for rows in finished.values()
        for f in rows
        if ipaddress.ip_address(str(f.client_addr)) == address and f.logged_at > cut.up_at
    )
    if after == 0 and cut.left_at_up >= run.total // 20:
        report.problem("the cut host completed nothing after its link came back")


def summary(run: MultihostRun, report: MultihostReport) -> str:
    """A few lines for humans."""
    config = run.config
    rate = report.jobs_per_second
    lines = [
        f"{config.hosts} hosts x {config.workers_per_host} workers (concurrency "
        f"{config.concurrency}, batch {config.batch}), {report.jobs} jobs: "
        f"{report.succeeded} succeeded, {report.spans} committed completions "
        f"{dict(sorted(report.spans_by_host.items()))}",
        f"drain {report.drain_seconds or 0:.1f}s (database clock) = "
        f"{rate or 0:,.0f} jobs/s; claim-to-commit p50 {report.latency_p50_ms or 0:.1f} ms, "
        f"p99 {report.latency_p99_ms or 0:.1f} ms",
        f"jobs run more than once {report.rerun_jobs}, failed attempts {report.failed_attempts},"
        f" claims {report.claims}, reclaims {report.reclaims} ({report.reclaims_of_cut} of the"
        " cut host)",
    ]
    if run.cut is not None:
        cut = run.cut
        lines.append(
            f"cut {cut.host} at {cut.done_at_cut} done for {cut.held_seconds:.1f}s; last of its "
            f"jobs back after {report.recovery_seconds or 0:.1f}s; it committed again "
            f"{cut.resumed_after if cut.resumed_after is not None else float('nan'):.1f}s after "
            f"link-up; fenced completions: {report.fenced_by_cut} by the cut host "
            f"({report.fenced_matched} matched in the reclaim log, "
            f"{report.fenced_acked_before} re-sent after their commit's reply was lost), "
            f"{report.claims_during_cut} claims written after the cut (all reclaimed), "
            f"{report.fenced_elsewhere} elsewhere"
        )
    lines.append(f"problems: {len(report.problems)}")
    lines += [f"  {p}" for p in report.problems[:25]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(worker_main())
