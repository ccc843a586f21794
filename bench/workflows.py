"""The workflow benchmark (issue 29): fan-out, fan-in, chains and a hot callback.

    python -m bench.workflows                       # about 3 minutes, the peers included
    python -m bench.workflows --children 2000 --chords 50 --chain 200 --no-peers

It creates a scratch database (``sqlaq_bench_<pid>_<hex>``, as :mod:`bench.run` does), and
prints one table of figures, each beside its target:

1. **Fan-out write**: a chord of ``--children`` children and one callback, built and
   written by ``wf.enqueue(session)`` in one transaction; seconds from the first
   ``add`` to the commit's return (median of ``--repeat``). Beside it, the same number
   of plain jobs by ``enqueue_many`` in one transaction.
2. **Chord drain**: ``--workers`` worker processes (concurrency ``--concurrency``) drain
   the written chord, against the same number of independent jobs of the same no-op
   task. The clock runs from the start barrier to the last ``finished_at`` (the chord's
   callback included); jobs/s of each and their ratio, repeats interleaved.
3. **Fan-in latency**: one idle worker listening; ``--chords`` small chords of
   ``--chord-size`` children, enqueued one after the other (the next once the last one's
   callback has run). Per chord: the callback's start minus the commit of its last
   child (see "the commit moment" below); p50 and p99.
4. **Chain**: a chain of ``--chain`` steps on one idle worker; per hop, a step's start
   minus the commit of the step before it; p50 and p99.
5. **Hot spot**: ``--children`` children finishing at once on one callback, drained by
   ``--hot-workers`` processes of concurrency ``--hot-concurrency`` (more completions in
   flight at a time than in 2), against the same jobs as plain jobs; the clock stops at
   the last child's completion (the callback's own run is left out): the completion
   throughput with and without the fan-in, and their ratio.
6. **Peers** (``--peers``), the same shapes in the same run, each as a ratio to
   sqla_queue: pg-boss 12's ``flow()`` (Node, :mod:`bench.node_peers` installs it) and
   Chancy's workflow plugin (PyPI ``chancy``, in tables of its own in a second scratch
   database). A peer that cannot run prints why and the run goes on.

**The commit moment.** A handler cannot see the commit of its own completion: that
happens after it returns, in the worker's completing transaction (where the release of
the dependents is written too). For the latency figures the benchmark installs, in its
scratch database only, a *deferred* constraint trigger on the jobs table that inserts
``clock_timestamp()`` into a side table when a job's status becomes ``succeeded``: a
deferred trigger fires inside ``COMMIT``, after every statement of the transaction (the
release included) and just before the commit record is flushed. The mark is therefore
at most the commit's WAL flush earlier than the moment other sessions can see the
commit, so the latencies are slightly pessimistic (they include that flush), never
optimistic. The callback (or next step) returns ``time.time()`` taken as its first line;
the server's ``clock_timestamp()`` and Python's ``time.time()`` read the same realtime
clock when the server runs on this host (the default, 127.0.0.1; a remote ``--url``
mixes two clocks and the run says so). The trigger is dropped before the drains, so it
costs them nothing. pg-boss and Chancy complete in one autocommitted statement, whose
recorded completion time (``completed_on``; Chancy's ``completed_at``) stands for it.

Figures move with the machine's load: compare the ratios of one run. ``--json PATH`` and
``--markdown PATH`` write the figures and the table too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from bench import workflow_tasks as wt
from bench.common import (
    BenchDatabase,
    TextTable,
    WorkerProcess,
    load_average,
    percentile,
    ratio,
    resolve_server_url,
)
from sqla_queue import Workflow

__all__ = [
    "TARGETS",
    "WorkflowsConfig",
    "chain_shape",
    "chord_shape",
    "fan_in_latencies",
    "hop_latencies",
    "main",
    "run_workflows",
]

queue = wt.queue

#: The issue's targets: (figure key, comparison, bound, how it reads).
TARGETS: dict[str, tuple[str, float, str]] = {
    "fanout_write_s": ("<=", 1.0, "fan-out write <= 1 s"),
    "chord_drain_ratio": (">=", 0.8, "chord drain >= 0.8x plain drain"),
    "fan_in_p99_ms": ("<=", 50.0, "fan-in p99 <= 50 ms"),
    "chain_hop_p50_ms": ("<=", 5.0, "chain hop p50 <= 5 ms"),
}
#: Seconds a worker process may take to stop and report.
STOP_TIMEOUT = 60.0
#: How often the drains look for their last completion.
POLL_S = 0.05


@dataclass(frozen=True)
class WorkflowsConfig:
    """The sizes of one run."""

    children: int = 10_000
    repeat: int = 2
    workers: int = 2
    concurrency: int = 10
    chords: int = 200
    chord_size: int = 5
    chain: int = 1_000
    hot_workers: int = 4
    hot_concurrency: int = 25
    peers: Sequence[str] = ("pgboss", "chancy")
    #: Chords and chain steps of the peers whose release is polled (seconds per hop).
    peer_chords: int = 10
    peer_chain: int = 10
    #: Seconds after which a peer's drain is stopped and reported at its rate so far.
    cap_s: float = 20.0


# -- shapes and statistics (pure) -----------------------------------------------------------


def chord_shape(children: int, *, n0: int = 0) -> Workflow:
    """A chord: ``children`` leaf calls side by side, then one callback after them all."""
    if children < 1:
        raise ValueError(f"a chord needs at least one child, got {children}")
    return queue.chord([wt.leaf.call(n=n0 + i) for i in range(children)], then=wt.join.call(n=n0))


def chain_shape(steps: int) -> Workflow:
    """A chain of ``steps`` step calls, each after the one before it."""
    if steps < 2:
        raise ValueError(f"a chain needs at least two steps, got {steps}")
    return queue.chain(*(wt.step.call(n=i) for i in range(steps)))


def hop_latencies(starts: Sequence[float], commits: Sequence[float]) -> list[float]:
    """Milliseconds of each hop of a chain: step ``i + 1``'s start minus step ``i``'s commit.

    ``starts`` and ``commits`` are epoch seconds, in the chain's order.
    """
    if len(starts) != len(commits):
        raise ValueError(f"{len(starts)} starts for {len(commits)} commits")
    return [1000 * (starts[i + 1] - commits[i]) for i in range(len(starts) - 1)]


def fan_in_latencies(chords: Sequence[tuple[float, Sequence[float]]]) -> list[float]:
    """Milliseconds of each chord's fan-in: its callback's start minus its last child's
    commit. ``chords`` holds ``(callback start, [child commits])`` in epoch seconds."""
    out = []
    for start, commits in chords:
        if not commits:
            raise ValueError("a chord without children has no fan-in")
        out.append(1000 * (start - max(commits)))
    return out


def meets(key: str, value: float) -> str:
    """``met``, ``NOT met`` or ``not measured`` for the target of ``key``."""
    if math.isnan(value):
        return "not measured"
    op, bound, _ = TARGETS[key]
    ok = value <= bound if op == "<=" else value >= bound
    return "met" if ok else "NOT met"


def fmt_ms(values: Sequence[float]) -> str:
    """``p50 / p99`` of millisecond values."""
    if not values:
        return "-"
    return f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f}"


# -- the scratch database -------------------------------------------------------------------


#: The side table and deferred trigger of "the commit moment" (see the module docstring).
MARKS_DDL = """
CREATE TABLE IF NOT EXISTS bench_commit_marks (job_id bigint PRIMARY KEY, at timestamptz);
CREATE OR REPLACE FUNCTION bench_mark_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_commit_marks VALUES (NEW.id, clock_timestamp())
  ON CONFLICT (job_id) DO UPDATE SET at = EXCLUDED.at;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS bench_mark_commit ON {jobs};
CREATE CONSTRAINT TRIGGER bench_mark_commit AFTER UPDATE OF status ON {jobs}
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.status = 'succeeded' AND OLD.status IS DISTINCT FROM 'succeeded')
  EXECUTE FUNCTION bench_mark_commit();
"""


def reset(db: BenchDatabase) -> None:
    """Empty the queue's job and workflow tables and the marks, then CHECKPOINT."""
    t = queue.tables
    names = [
        t.workflow_edges.fullname,
        t.workflow_nodes.fullname,
        t.workflows.fullname,
        t.executions.fullname,
        t.jobs.fullname,
    ]
    with db.connect() as conn:
        conn.execute(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE")
        conn.execute("DROP TABLE IF EXISTS bench_commit_marks CASCADE")
    db.settle([], "cold")


def install_marks(db: BenchDatabase) -> None:
    """Install the commit-moment trigger (see the module docstring)."""
    with db.connect() as conn:
        conn.execute(MARKS_DDL.format(jobs=queue.tables.jobs.fullname))


def drop_marks(db: BenchDatabase) -> None:
    """Remove the trigger and its table."""
    with db.connect() as conn:
        conn.execute(f"DROP TRIGGER IF EXISTS bench_mark_commit ON {queue.tables.jobs.fullname}")
        conn.execute("DROP TABLE IF EXISTS bench_commit_marks")


def commit_marks(db: BenchDatabase, job_ids: Sequence[int]) -> dict[int, float]:
    """The commit marks (epoch seconds) of ``job_ids``."""
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT job_id, extract(epoch FROM at)::float8 FROM bench_commit_marks "
            "WHERE job_id = ANY(%s)",
            (list(job_ids),),
        ).fetchall()
    return {int(k): float(v) for k, v in rows}


def same_host(url: str) -> bool:
    """Whether the server of ``url`` runs on this host (one realtime clock for both)."""
    host = make_url(url).host or ""
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


# -- worker processes -----------------------------------------------------------------------


def start_workers(db: BenchDatabase, count: int, concurrency: int) -> list[WorkerProcess]:
    """``count`` workflow worker processes, ready (past their set-up), not yet released."""
    command = (sys.executable, "-m", "bench.workflow_tasks")
    args = ["--url", db.url, "--concurrency", str(concurrency), "--poll-interval", "1"]
    procs = [WorkerProcess(args, command=command) for _ in range(count)]
    try:
        for p in procs:
            p.wait_ready()
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return procs


def stop_workers(procs: Sequence[WorkerProcess]) -> list[dict[str, Any]]:
    """SIGTERM every process, collect their reports, kill leftovers."""
    try:
        for p in procs:
            p.terminate()
        return [p.finish(STOP_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()


# -- 1. fan-out write -----------------------------------------------------------------------


def fanout_write(db: BenchDatabase, children: int) -> dict[str, float]:
    """Seconds to build and write one chord, and to write as many plain jobs."""
    assert db.engine is not None
    reset(db)
    started = time.perf_counter()
    wf = chord_shape(children)
    built = time.perf_counter()
    with Session(db.engine) as session, session.begin():
        handle = wf.enqueue(session)
    written = time.perf_counter()
    assert len(handle.jobs) == children + 1
    reset(db)
    plain_started = time.perf_counter()
    with Session(db.engine) as session, session.begin():
        queue.enqueue_many(session, (wt.leaf.call(n=i) for i in range(children + 1)))
    plain = time.perf_counter() - plain_started
    return {
        "build_s": built - started,
        "enqueue_s": written - built,
        "total_s": written - started,
        "plain_s": plain,
    }


# -- 2 and 5. drains ------------------------------------------------------------------------


@dataclass
class Drain:
    """One timed drain of a chord or of plain jobs."""

    kind: str
    children: int
    #: From the start barrier to the last completion (the callback's, for a chord).
    seconds: float
    #: From the start barrier to the last child's completion.
    children_seconds: float
    cpu_s: float = 0.0
    reports: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def rate(self) -> float:
        """Children per second, end to end."""
        return self.children / self.seconds

    @property
    def completion_rate(self) -> float:
        """Children's completions per second (the callback's run left out)."""
        return self.children / self.children_seconds


def drain_once(
    db: BenchDatabase, kind: str, children: int, workers: int, concurrency: int
) -> Drain:
    """``children`` leaf jobs, in a chord (``kind="chord"``) or plain, drained and timed."""
    assert db.engine is not None
    reset(db)
    with Session(db.engine) as session, session.begin():
        if kind == "chord":
            chord_shape(children).enqueue(session)
        else:
            queue.enqueue_many(session, (wt.leaf.call(n=i) for i in range(children)))
    total = children + (1 if kind == "chord" else 0)
    db.settle([], "cold")
    procs = start_workers(db, workers, concurrency)
    try:
        with db.connect() as conn:
            t0 = _clock(conn)
            for p in procs:
                p.go()
            deadline = time.monotonic() + max(120.0, children / 100)
            while True:
                row = conn.execute(
                    f"SELECT count(*) FROM {queue.tables.jobs.fullname} WHERE status = 'succeeded'"
                ).fetchone()
                assert row is not None
                if int(row[0]) >= total:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} drain: {row[0]} of {total} jobs done in time")
                time.sleep(POLL_S)
    finally:
        reports = stop_workers(procs)
    with db.connect() as conn:
        row = conn.execute(
            f"SELECT max(finished_at), max(finished_at) FILTER (WHERE task = %s), "
            "count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1) "
            f"FROM {queue.tables.jobs.fullname}",
            (wt.LEAF,),
        ).fetchone()
    assert row is not None
    last, last_child, once = row
    if once != total:
        raise RuntimeError(f"{kind} drain: {once} of {total} jobs succeeded exactly once")
    return Drain(
        kind,
        children,
        (last - t0).total_seconds(),
        (last_child - t0).total_seconds(),
        sum(float(r["cpu_s"]) for r in reports),
        reports,
    )


def _clock(conn: Any) -> dt.datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


def drains(
    db: BenchDatabase, children: int, workers: int, concurrency: int, repeat: int, log: Any
) -> dict[str, list[Drain]]:
    """Plain and chord drains, ``repeat`` rounds, the order alternating round by round."""
    runs: dict[str, list[Drain]] = {"plain": [], "chord": []}
    for rnd in range(repeat):
        for kind in ("plain", "chord") if rnd % 2 == 0 else ("chord", "plain"):
            run = drain_once(db, kind, children, workers, concurrency)
            runs[kind].append(run)
            log(
                f"  {kind:<5} {workers}x{concurrency}: {run.rate:,.0f} jobs/s end to end, "
                f"{run.completion_rate:,.0f} completions/s"
            )
    return runs


def paired_ratio(runs: dict[str, list[Drain]], rate: Callable[[Drain], float]) -> float:
    """The median over rounds of chord/plain (each round's own pair)."""
    pairs = zip(runs["chord"], runs["plain"], strict=True)
    return statistics.median(rate(c) / rate(p) for c, p in pairs)


# -- 3 and 4. latencies ---------------------------------------------------------------------


def fan_in(db: BenchDatabase, chords: int, size: int) -> list[float]:
    """Fan-in latency (ms) of ``chords`` chords of ``size`` children, one idle worker."""
    assert db.engine is not None
    reset(db)
    install_marks(db)
    procs = start_workers(db, 1, 10)
    found: list[tuple[float, list[int]]] = []
    try:
        for p in procs:
            p.go()
        time.sleep(1.0)  # the worker LISTENs and settles into its idle wait
        for i in range(-5, chords):  # the first 5 warm up, uncounted
            with Session(db.engine) as session, session.begin():
                handle = chord_shape(size, n0=1000 * (i + 10)).enqueue(session)
            callback = handle.jobs[wt.JOIN]
            start = queue.result(db.engine, callback, timeout=30)
            if i >= 0:
                assert isinstance(start, float)
                found.append((start, [j for name, j in handle.jobs.items() if name != wt.JOIN]))
    finally:
        stop_workers(procs)
    marks = commit_marks(db, [j for _, ids in found for j in ids])
    drop_marks(db)
    return fan_in_latencies([(start, [marks[j] for j in ids]) for start, ids in found])


def chain_hops(db: BenchDatabase, steps: int) -> list[float]:
    """Per-hop latency (ms) of a chain of ``steps`` steps on one idle worker."""
    assert db.engine is not None
    reset(db)
    install_marks(db)
    with Session(db.engine) as session, session.begin():
        handle = chain_shape(steps).enqueue(session)
    # Node names of one task: the task's name, then "#2", "#3"... in the chain's order.
    ids = [handle.jobs[wt.STEP if i == 1 else f"{wt.STEP}#{i}"] for i in range(1, steps + 1)]
    procs = start_workers(db, 1, 10)
    try:
        for p in procs:
            p.go()
        queue.result(db.engine, ids[-1], timeout=max(60.0, steps * 0.5))
    finally:
        stop_workers(procs)
    with db.connect() as conn:
        rows = conn.execute(
            f"SELECT id, result FROM {queue.tables.jobs.fullname} WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    starts = {int(k): float(v) for k, v in rows}
    marks = commit_marks(db, ids)
    drop_marks(db)
    return hop_latencies([starts[j] for j in ids], [marks[j] for j in ids])


# -- the run --------------------------------------------------------------------------------


def run_workflows(db: BenchDatabase, config: WorkflowsConfig, log: Any = print) -> dict[str, Any]:
    """Every measurement of sqla_queue (then the peers'); the figures and the table."""
    figures: dict[str, Any] = {}
    # Cheap beside the drains: at least 3, for a steadier median on a noisy machine.
    writes = [fanout_write(db, config.children) for _ in range(max(3, config.repeat))]
    for key in ("build_s", "enqueue_s", "total_s", "plain_s"):
        figures[f"fanout_{key}"] = statistics.median(w[key] for w in writes)
    figures["fanout_write_s"] = figures["fanout_total_s"]
    log(
        f"  fan-out write: {figures['fanout_total_s']:.3f} s (build "
        f"{figures['fanout_build_s']:.3f} s, enqueue + commit {figures['fanout_enqueue_s']:.3f} s)"
    )
    runs = drains(db, config.children, config.workers, config.concurrency, config.repeat, log)
    figures["plain_rate"] = statistics.median(r.rate for r in runs["plain"])
    figures["chord_rate"] = statistics.median(r.rate for r in runs["chord"])
    figures["chord_drain_ratio"] = paired_ratio(runs, lambda r: r.rate)
    for kind in ("plain", "chord"):
        # The worker processes' CPU per job: steadier than the rates on a shared machine.
        figures[f"{kind}_cpu_us"] = statistics.median(
            1e6 * r.cpu_s / r.children for r in runs[kind]
        )
    fan = fan_in(db, config.chords, config.chord_size)
    figures["fan_in_ms"] = fan
    figures["fan_in_p50_ms"] = percentile(fan, 50)
    figures["fan_in_p99_ms"] = percentile(fan, 99)
    log(f"  fan-in: p50/p99 {fmt_ms(fan)} ms")
    hops = chain_hops(db, config.chain)
    figures["chain_ms"] = hops
    figures["chain_hop_p50_ms"] = percentile(hops, 50)
    figures["chain_hop_p99_ms"] = percentile(hops, 99)
    log(f"  chain: p50/p99 {fmt_ms(hops)} ms per hop")
    hot = drains(
        db, config.children, config.hot_workers, config.hot_concurrency, config.repeat, log
    )
    figures["hot_plain_rate"] = statistics.median(r.completion_rate for r in hot["plain"])
    figures["hot_chord_rate"] = statistics.median(r.completion_rate for r in hot["chord"])
    figures["hot_ratio"] = paired_ratio(hot, lambda r: r.completion_rate)
    peers: dict[str, dict[str, Any]] = {}
    for peer in config.peers:
        peers[peer] = run_peer(db, peer, config, log)
    figures["peers"] = peers
    return {"figures": figures, "table": table_of(figures, config)}


def run_peer(db: BenchDatabase, peer: str, config: WorkflowsConfig, log: Any) -> dict[str, Any]:
    """One peer's figures, or ``{"skipped": reason}``: a peer never fails the run."""
    from bench import workflow_peers

    try:
        runner = workflow_peers.RUNNERS[peer]
    except KeyError:
        return {"skipped": f"unknown peer {peer!r}"}
    try:
        return runner(db, config, log)
    except workflow_peers.PeerUnavailable as exc:
        log(f"  {peer}: skipped: {exc}")
        return {"skipped": str(exc)}
    except Exception as exc:  # a peer's failure is reported, never fatal
        log(f"  {peer}: failed: {type(exc).__name__}: {exc}")
        return {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:300]}"}


def table_of(figures: dict[str, Any], config: WorkflowsConfig) -> TextTable:
    """The table of figures, each with its target, and the peers' ratios."""
    n = f"{config.children:,}"
    table = TextTable(
        "Workflows (issue 29): sqla_queue, with the peers as ratios",
        ["shape", "sqla_queue", "target", "", *(PEER_LABELS.get(p, p) for p in config.peers)],
    )
    peers = figures.get("peers", {})

    def peer_cells(key: str, fmt: Callable[[float], str]) -> list[str]:
        cells = []
        for p in config.peers:
            got = peers.get(p, {})
            if "skipped" in got:
                cells.append("skipped")
            elif key in got and not math.isnan(got[key]):
                cells.append(fmt(got[key]))
            else:
                cells.append("-")
        return cells

    table.add(
        f"1. fan-out write: chord of {n} + 1, one transaction (s)",
        f"{figures['fanout_total_s']:.3f}",
        "<= 1 s",
        meets("fanout_write_s", figures["fanout_total_s"]),
        *peer_cells("fanout_write_s", lambda v: f"{v:.3f} s"),
    )
    table.add(
        "   of which: building the Workflow / enqueue and commit (s)",
        f"{figures['fanout_build_s']:.3f} / {figures['fanout_enqueue_s']:.3f}",
        "",
        "",
        *("" for _ in config.peers),
    )
    table.add(
        f"   {n} + 1 plain jobs by enqueue_many, one transaction (s)",
        f"{figures['fanout_plain_s']:.3f}",
        "",
        "",
        *peer_cells("plain_write_s", lambda v: f"{v:.3f} s"),
    )
    table.add(
        f"2. drain by {config.workers} processes x {config.concurrency}: plain jobs/s",
        f"{figures['plain_rate']:,.0f}",
        "",
        "",
        *peer_cells("plain_rate", lambda v: f"{v:,.0f}"),
    )
    table.add(
        "   chord (children + callback) jobs/s",
        f"{figures['chord_rate']:,.0f}",
        "",
        "",
        *peer_cells("chord_rate", lambda v: f"{v:,.0f}"),
    )
    table.add(
        "   worker CPU per job, plain / chord (us)",
        f"{figures['plain_cpu_us']:,.0f} / {figures['chord_cpu_us']:,.0f}",
        "",
        "",
        *("" for _ in config.peers),
    )
    table.add(
        "   chord / plain",
        f"{figures['chord_drain_ratio']:.2f}x",
        ">= 0.8x",
        meets("chord_drain_ratio", figures["chord_drain_ratio"]),
        *peer_cells("chord_drain_ratio", lambda v: f"{v:.2f}x"),
    )
    table.add(
        f"3. fan-in latency, {config.chords} chords of {config.chord_size}, p50 / p99 (ms)",
        fmt_ms(figures["fan_in_ms"]),
        "p99 <= 50 ms",
        meets("fan_in_p99_ms", figures["fan_in_p99_ms"]),
        *peer_cells("fan_in_p50_ms", lambda v: f"p50 {v:,.0f} ms"),
    )
    table.add(
        f"4. chain of {config.chain:,}: per hop, p50 / p99 (ms)",
        fmt_ms(figures["chain_ms"]),
        "p50 <= 5 ms",
        meets("chain_hop_p50_ms", figures["chain_hop_p50_ms"]),
        *peer_cells("chain_hop_p50_ms", lambda v: f"p50 {v:,.0f} ms"),
    )
    table.add(
        f"5. hot spot, {config.hot_workers} x {config.hot_concurrency}: plain completions/s",
        f"{figures['hot_plain_rate']:,.0f}",
        "",
        "",
        *peer_cells("hot_plain_rate", lambda v: f"{v:,.0f}"),
    )
    table.add(
        f"   {n} children on one callback, completions/s",
        f"{figures['hot_chord_rate']:,.0f}",
        "",
        "",
        *peer_cells("hot_chord_rate", lambda v: f"{v:,.0f}"),
    )
    table.add(
        "   with fan-in / without",
        f"{figures['hot_ratio']:.2f}x",
        "",
        "",
        *peer_cells("hot_ratio", lambda v: f"{v:.2f}x"),
    )
    for p in config.peers:
        got = peers.get(p, {})
        label = PEER_LABELS.get(p, p)
        if "skipped" in got:
            table.note(f"{label}: skipped: {got['skipped']}")
        for line in got.get("notes", []):
            table.note(f"{label}: {line}")
        vs = [
            f"{name} {fmt_vs(figures, got, key, higher)}"
            for name, key, higher in (
                ("write", "fanout_write_s", False),
                ("chord drain", "chord_rate", True),
                ("fan-in p50", "fan_in_p50_ms", False),
                ("hop p50", "chain_hop_p50_ms", False),
            )
            if key in got
        ]
        if vs:
            table.note(f"sqla_queue vs {label} (above 1.00x: sqla_queue better): " + ", ".join(vs))
    return table


#: Column labels of the peers.
PEER_LABELS = {"pgboss": "pg-boss 12 flow", "chancy": "Chancy workflows"}


def fmt_vs(ours: dict[str, Any], theirs: dict[str, Any], key: str, higher: bool) -> str:
    """How many times better sqla_queue's figure ``key`` is than the peer's."""
    value = ratio(ours[key], theirs[key]) if higher else ratio(theirs[key], ours[key])
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.workflows", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", help="PostgreSQL server to use (any database on it)")
    d = WorkflowsConfig()
    parser.add_argument("--children", type=int, default=d.children, help="chord size (1, 2, 5)")
    parser.add_argument("--repeat", type=int, default=d.repeat, help="rounds of 1, 2 and 5")
    parser.add_argument("--workers", type=int, default=d.workers, help="drain processes")
    parser.add_argument("--concurrency", type=int, default=d.concurrency)
    parser.add_argument("--chords", type=int, default=d.chords, help="fan-in: chords")
    parser.add_argument("--chord-size", type=int, default=d.chord_size, help="fan-in: children")
    parser.add_argument("--chain", type=int, default=d.chain, help="chain steps")
    parser.add_argument("--hot-workers", type=int, default=d.hot_workers)
    parser.add_argument("--hot-concurrency", type=int, default=d.hot_concurrency)
    parser.add_argument(
        "--peers", default=",".join(d.peers), help="comma-separated of pgboss,chancy ('' none)"
    )
    parser.add_argument("--no-peers", action="store_true", help="sqla_queue alone")
    parser.add_argument("--peer-chords", type=int, default=d.peer_chords)
    parser.add_argument("--peer-chain", type=int, default=d.peer_chain)
    parser.add_argument("--cap", type=float, default=d.cap_s, help="a peer's drain cap (s)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--markdown", type=Path, help="write the table as Markdown too")
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> WorkflowsConfig:
    """The configuration the command line asks for."""
    peers = () if args.no_peers else tuple(p for p in args.peers.split(",") if p)
    return WorkflowsConfig(
        children=args.children,
        repeat=args.repeat,
        workers=args.workers,
        concurrency=args.concurrency,
        chords=args.chords,
        chord_size=args.chord_size,
        chain=args.chain,
        hot_workers=args.hot_workers,
        hot_concurrency=args.hot_concurrency,
        peers=peers,
        peer_chords=args.peer_chords,
        peer_chain=args.peer_chain,
        cap_s=args.cap,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    args = parse_args(argv)
    config = config_of(args)
    server = resolve_server_url(args.url)
    if not same_host(server):
        print("warning: the server is not on this host: latencies mix two clocks")
    began = time.monotonic()
    print(f"load average at start: {load_average()}")
    with BenchDatabase(server, keep=args.keep) as db:
        result = run_workflows(db, config)
    table = result["table"]
    print(table.render())
    print(f"load average at end: {load_average()}; {time.monotonic() - began:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(result["figures"], indent=1, default=str))
    if args.markdown:
        args.markdown.write_text(table.markdown() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
