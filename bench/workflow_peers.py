"""The peers of the workflow benchmark: pg-boss 12's ``flow()`` and Chancy's workflows.

Each peer runs the shapes of :mod:`bench.workflows` in the same run: the fan-out write,
the chord drain beside a plain drain, fan-in latency, a chain's hops and the hot spot.
Their releases are not written with the completion, so their latencies are bounded by
their own intervals, not by the database:

* pg-boss 12 (Node, ``bench/node/flows.mjs``; :mod:`bench.node_peers` installs it): a
  flow's dependents are released by a background resolver every ``flowIntervalSeconds``
  (1 s, its least) in an instance with ``supervise`` on, and a released job waits for
  its worker's next poll (0.5 s, its least; the resolver sends no NOTIFY).
* Chancy (:mod:`bench.workflow_chancy`): the leader's workflow plugin advances a workflow
  on the notification of a step's completion, which the worker writes in batches.

So their latency shapes run on fewer chords and a shorter chain (``peer_chords``,
``peer_chain``), and each drain is capped (``cap_s``): a capped drain is reported at the
rate it reached. Any failure of a peer becomes a skip line with its reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from bench import node_peers
from bench.common import BenchDatabase, WorkerProcess, libpq_dsn, percentile
from bench.workflows import (
    Drain,
    WorkflowsConfig,
    fan_in_latencies,
    hop_latencies,
    paired_ratio,
    stop_workers,
)
from sqla_queue.testing.databases import url_for_database

__all__ = ["RUNNERS", "ChancyPeer", "PeerUnavailable", "PgBossPeer", "measure"]


class PeerUnavailable(RuntimeError):
    """The peer cannot be installed or started here: the reason."""


class Peer:
    """What the driver needs of a peer (see :class:`PgBossPeer`, :class:`ChancyPeer`)."""

    name = "peer"
    dsn = ""

    def prepare(self) -> None:
        """Fresh, empty tables."""
        raise NotImplementedError

    def write(self, children: int) -> tuple[float, float]:
        """Seconds to write a chord of ``children`` + 1, and ``children`` + 1 plain jobs."""
        raise NotImplementedError

    def enqueue(self, kind: str, children: int) -> None:
        """Write a chord (``kind="chord"``) or ``children`` plain leaves."""
        raise NotImplementedError

    def worker_command(self, concurrency: int) -> list[str]:
        """The command of one worker process with :mod:`bench.worker`'s contract."""
        raise NotImplementedError

    def done(self, conn: psycopg.Connection[Any]) -> int:
        """How many jobs have completed."""
        raise NotImplementedError

    def times(self, conn: psycopg.Connection[Any]) -> tuple[Any, Any, int]:
        """The last completion, the last leaf's completion, and the leaves completed."""
        raise NotImplementedError

    def fan_in(self, chords: int, size: int) -> list[tuple[float, list[float]]]:
        """``(callback start, [children's completions])`` of chords one after the other."""
        raise NotImplementedError

    def chain(self, steps: int) -> tuple[list[float], list[float]]:
        """Starts and completions of a chain's steps, in order (epoch seconds)."""
        raise NotImplementedError


def _run(command: Sequence[str], timeout: float) -> str:
    done = subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command[1]} {command[2]} failed:\n{done.stderr[-1500:]}")
    return done.stdout


class PgBossPeer(Peer):
    """pg-boss 12 through ``bench/node/flows.mjs``, in the benchmark's scratch database."""

    name = "pgboss"
    SCRIPT = node_peers.NODE_DIR / "flows.mjs"

    def __init__(self, db: BenchDatabase) -> None:
        try:
            self.node = str(node_peers.ensure_installed())
        except node_peers.NodePeersUnavailable as exc:
            raise PeerUnavailable(str(exc)) from None
        self.dsn = db.dsn

    def _flows(self, *args: object, timeout: float = 300.0) -> Any:
        out = _run([self.node, str(self.SCRIPT), *map(str, args)], timeout)
        lines = [x for x in out.splitlines() if x.startswith("{")]
        return json.loads(lines[-1]) if lines else None

    def prepare(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS pgboss CASCADE")
        self._flows("install", self.dsn)

    def write(self, children: int) -> tuple[float, float]:
        got = self._flows("write", self.dsn, children)
        return float(got["flow_s"]), float(got["insert_s"])

    def enqueue(self, kind: str, children: int) -> None:
        self._flows(kind, self.dsn, children)

    def worker_command(self, concurrency: int) -> list[str]:
        return [self.node, str(self.SCRIPT), "worker", self.dsn, str(concurrency)]

    def done(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT count(*) FROM pgboss.job WHERE state = 'completed'").fetchone()
        assert row is not None
        return int(row[0])

    def times(self, conn: psycopg.Connection[Any]) -> tuple[Any, Any, int]:
        row = conn.execute(
            "SELECT max(completed_on), max(completed_on) FILTER (WHERE name = 'wf-leaf'), "
            "count(*) FILTER (WHERE name = 'wf-leaf' AND state = 'completed') FROM pgboss.job"
        ).fetchone()
        assert row is not None
        return row[0], row[1], int(row[2])

    def fan_in(self, chords: int, size: int) -> list[tuple[float, list[float]]]:
        got = self._flows("fanin", self.dsn, chords, size, timeout=60 + 10 * chords)
        return [(float(t), [float(c)]) for t, c in got["chords"]]

    def chain(self, steps: int) -> tuple[list[float], list[float]]:
        got = self._flows("chain", self.dsn, steps, timeout=60 + 10 * steps)
        return got["starts"], got["commits"]


class ChancyPeer(Peer):
    """Chancy's workflow plugin, in a scratch database of its own (dropped by :meth:`close`)."""

    name = "chancy"

    def __init__(self, db: BenchDatabase) -> None:
        if importlib.util.find_spec("chancy") is None:
            raise PeerUnavailable("chancy is not installed: pip install chancy (the bench extra)")
        from bench import workflow_chancy

        self.module = workflow_chancy
        self.server_url = db.server_url
        self.name_db = f"{db.name}_chancy"
        self._admin(f'CREATE DATABASE "{self.name_db}"')
        self.dsn = libpq_dsn(url_for_database(db.server_url, self.name_db))

    def _admin(self, statement: str) -> None:
        admin = create_engine(self.server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with admin.connect() as conn:
                conn.execute(text(statement))
        finally:
            admin.dispose()

    def close(self) -> None:
        """Drop the scratch database."""
        self._admin(f'DROP DATABASE IF EXISTS "{self.name_db}" WITH (FORCE)')

    def prepare(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
        self.module.install(self.dsn)

    def write(self, children: int) -> tuple[float, float]:
        flow_s, plain_s = self.module.write(self.dsn, children)
        return float(flow_s), float(plain_s)

    def enqueue(self, kind: str, children: int) -> None:
        (self.module.chord if kind == "chord" else self.module.plain)(self.dsn, children)

    def worker_command(self, concurrency: int) -> list[str]:
        # Chancy's concurrency is the queue's (10, set by install()).
        return [sys.executable, "-m", "bench.workflow_chancy", "--dsn", self.dsn]

    def done(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'").fetchone()
        assert row is not None
        return int(row[0])

    def times(self, conn: psycopg.Connection[Any]) -> tuple[Any, Any, int]:
        row = conn.execute(
            "SELECT max(completed_at), max(completed_at) FILTER (WHERE func LIKE '%leaf'), "
            "count(*) FILTER (WHERE func LIKE '%leaf' AND state = 'succeeded') FROM chancy_jobs"
        ).fetchone()
        assert row is not None
        return row[0], row[1], int(row[2])

    def fan_in(self, chords: int, size: int) -> list[tuple[float, list[float]]]:
        return self.module.fan_in(self.dsn, chords, size)

    def chain(self, steps: int) -> tuple[list[float], list[float]]:
        return self.module.chain(self.dsn, steps)


@contextlib.contextmanager
def _workers(peer: Peer, count: int, concurrency: int) -> Iterator[list[WorkerProcess]]:
    procs = [WorkerProcess([], command=peer.worker_command(concurrency)) for _ in range(count)]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.kill()


def drain(
    peer: Peer, kind: str, children: int, workers: int, concurrency: int, cap_s: float
) -> tuple[Drain, bool]:
    """One drain of ``peer``; whether it was capped (then timed to the cap)."""
    peer.prepare()
    peer.enqueue(kind, children)
    total = children + (1 if kind == "chord" else 0)
    with (
        _workers(peer, workers, concurrency) as procs,
        psycopg.connect(peer.dsn, autocommit=True) as conn,
    ):
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        t0 = row[0]
        for p in procs:
            p.go()
        deadline = time.monotonic() + cap_s
        while peer.done(conn) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        capped = peer.done(conn) < total
        now = conn.execute("SELECT clock_timestamp()").fetchone()
        assert now is not None
        stop_workers(procs)
        last, last_leaf, leaves = peer.times(conn)
    if capped:
        elapsed = (now[0] - t0).total_seconds()
        return Drain(kind, leaves, elapsed, elapsed), True
    return Drain(
        kind, children, (last - t0).total_seconds(), (last_leaf - t0).total_seconds()
    ), False


def _idle(peer: Peer, body: Callable[[], Any]) -> Any:
    """``body()`` while one idle worker of ``peer`` runs."""
    with _workers(peer, 1, 10) as procs:
        for p in procs:
            p.go()
        time.sleep(1.0)
        try:
            return body()
        finally:
            stop_workers(procs)


def measure(peer: Peer, config: WorkflowsConfig, log: Any) -> dict[str, Any]:
    """Every shape of ``peer`` (one round each): the figures keyed as sqla_queue's."""
    figures: dict[str, Any] = {"notes": []}
    peer.prepare()
    figures["fanout_write_s"], figures["plain_write_s"] = peer.write(config.children)
    log(f"  {peer.name}: fan-out write {figures['fanout_write_s']:.3f} s")
    for prefix, workers, concurrency in (
        ("", config.workers, config.concurrency),
        ("hot_", config.hot_workers, config.hot_concurrency),
    ):
        runs: dict[str, list[Drain]] = {}
        for kind in ("plain", "chord"):
            run, capped = drain(peer, kind, config.children, workers, concurrency, config.cap_s)
            runs[kind] = [run]
            if capped:
                figures["notes"].append(
                    f"{kind} drain {workers} x {concurrency} capped at {config.cap_s:.0f} s "
                    f"({run.children:,} of {config.children:,} children done): its rate is "
                    "the rate reached"
                )
            log(f"  {peer.name}: {kind} {workers}x{concurrency}: {run.rate:,.0f} jobs/s")
        if prefix:
            figures["hot_plain_rate"] = runs["plain"][0].completion_rate
            figures["hot_chord_rate"] = runs["chord"][0].completion_rate
            figures["hot_ratio"] = paired_ratio(runs, lambda r: r.completion_rate)
        else:
            figures["plain_rate"] = runs["plain"][0].rate
            figures["chord_rate"] = runs["chord"][0].rate
            figures["chord_drain_ratio"] = paired_ratio(runs, lambda r: r.rate)
    peer.prepare()
    fan = fan_in_latencies(_idle(peer, lambda: peer.fan_in(config.peer_chords, config.chord_size)))
    figures["fan_in_ms"] = fan
    figures["fan_in_p50_ms"] = percentile(fan, 50)
    figures["fan_in_p99_ms"] = percentile(fan, 99)
    peer.prepare()
    starts, commits = _idle(peer, lambda: peer.chain(config.peer_chain))
    hops = hop_latencies(starts, commits)
    figures["chain_ms"] = hops
    figures["chain_hop_p50_ms"] = percentile(hops, 50)
    figures["chain_hop_p99_ms"] = percentile(hops, 99)
    log(
        f"  {peer.name}: fan-in p50 {figures['fan_in_p50_ms']:.0f} ms ({config.peer_chords} "
        f"chords), hop p50 {figures['chain_hop_p50_ms']:.0f} ms ({config.peer_chain} steps)"
    )
    figures["notes"].append(
        f"latencies over {config.peer_chords} chords and a chain of {config.peer_chain} steps"
    )
    return figures


def run_pgboss(db: BenchDatabase, config: WorkflowsConfig, log: Any) -> dict[str, Any]:
    """pg-boss's figures."""
    peer = PgBossPeer(db)
    try:
        return measure(peer, config, log)
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS pgboss CASCADE")


def run_chancy(db: BenchDatabase, config: WorkflowsConfig, log: Any) -> dict[str, Any]:
    """Chancy's figures."""
    peer = ChancyPeer(db)
    try:
        return measure(peer, config, log)
    finally:
        if not db.keep:
            peer.close()


#: The peers by name.
RUNNERS: dict[str, Callable[[BenchDatabase, WorkflowsConfig, Any], dict[str, Any]]] = {
    "pgboss": run_pgboss,
    "chancy": run_chancy,
}
