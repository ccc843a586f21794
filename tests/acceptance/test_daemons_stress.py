"""Two worker processes, three daemons and ordinary jobs: capacity, failover, no overlap.

One test, in phases, on one database:

1. two workers of a queue without daemons drain bursts of no-op jobs (the baseline);
2. two workers of the same queue with three daemons drain the same bursts: the throughput
   must not be much lower (daemons take no handler seat);
3. the process running ``ticker_a`` is killed with SIGKILL: the daemon must run again on the
   other process within its lost interval (plus one acquire round);
4. the survivor stops on SIGTERM: its daemons stop and their rows are released.

Every daemon run records its span (database clock, process id, run id). For each daemon,
no two runs may overlap: a killed process runs nothing after its last tick, and a run is
only started after the previous holder's lease ran out or was released.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session, sessionmaker

from tests.support.daemon_app import (
    DAEMON_LEASE,
    DAEMON_NAMES,
    daemon_ticks,
    plain_queue,
    queue,
)
from tests.support.processes import start_worker

pytestmark = pytest.mark.acceptance

JOBS = 4000
#: Drains per phase; the fastest counts (the machine's noise only ever slows one down).
ROUNDS = 2
WARMUP = 200
#: With daemons, ordinary throughput must keep at least this share of the baseline. Loose
#: on purpose: two short runs on a shared machine differ by tens of percent on their own,
#: more in the full suite, where another test process runs beside this one (0.48 seen
#: there). The seats themselves are proven exactly by the integration test
#: (tests/integration/test_daemons.py: concurrency 2 with 3 daemons still runs 2 jobs at
#: once); this ratio only catches a gross slowdown of ordinary jobs.
MIN_RATIO = 0.35
#: After a SIGKILL: the lease runs out (at most DAEMON_LEASE after the last renewal), then
#: the survivor's next acquire round (a quarter of the lease) takes it; plus start-up slack.
FAILOVER_BOUND = DAEMON_LEASE + DAEMON_LEASE / 4 + 1.5


@pytest.fixture
def ticks_table(owner_engine: Engine) -> None:
    with owner_engine.begin() as connection:
        queue.tables.daemons.create(connection, checkfirst=True)
        daemon_ticks.create(connection, checkfirst=True)


def start_pair(db_url: str, target: str, logs: Path, tag: str) -> list[subprocess.Popen[bytes]]:
    return [
        start_worker(
            db_url,
            "--concurrency",
            "10",
            "--shutdown-timeout",
            "5",
            "--poll-interval",
            "0.5",
            log_path=logs / f"{tag}{i}.log",
            target=target,
        )
        for i in range(2)
    ]


def pending(session: Session) -> int:
    ex = queue.tables.executions
    return int(session.scalar(select(func.count()).select_from(ex)) or 0)


def drain(Session_: sessionmaker[Session], count: int, timeout: float = 60.0) -> float:
    """Enqueue ``count`` no-op jobs in one transaction; seconds until all are done."""
    with Session_.begin() as session:
        queue.enqueue_many(session, [stress_noop_call() for _ in range(count)])
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        with Session_() as session:
            if pending(session) == 0:
                return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{count} jobs not done within {timeout} s")


def stress_noop_call() -> Any:
    return queue.get_task("stress_noop").call()


def stop(processes: list[subprocess.Popen[bytes]], logs: Path) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    codes = [process.wait(timeout=30) for process in processes]
    text_ = "\n".join(p.read_text() for p in sorted(logs.glob("*.log")))
    assert all(code in (0, -signal.SIGKILL) for code in codes), (codes, text_)


def running_pids(Session_: sessionmaker[Session]) -> dict[str, int]:
    """The process of each daemon's latest record."""
    t = daemon_ticks
    with Session_() as session:
        rows = session.execute(
            select(t.c.name, t.c.pid).ext(distinct_on(t.c.name)).order_by(t.c.name, t.c.at.desc())
        ).all()
    return {row.name: row.pid for row in rows}


def spans(Session_: sessionmaker[Session]) -> dict[str, list[tuple[Any, Any, int, str]]]:
    """Each daemon's runs as (first record, last record, pid, run), in start order."""
    t = daemon_ticks
    with Session_() as session:
        rows = session.execute(
            select(t.c.name, t.c.run, t.c.pid, func.min(t.c.at), func.max(t.c.at))
            .group_by(t.c.name, t.c.run, t.c.pid)
            .order_by(t.c.name, func.min(t.c.at))
        ).all()
    result: dict[str, list[tuple[Any, Any, int, str]]] = {}
    for name, run, pid, first, last in rows:
        result.setdefault(name, []).append((first, last, pid, run))
    return result


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.mark.usefixtures("ticks_table")
def test_daemons_keep_capacity_fail_over_once_and_never_overlap(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    assert plain_queue.daemons == {} and sorted(queue.daemons) == sorted(DAEMON_NAMES)

    # 1. Baseline: no daemons.
    plain = start_pair(db_url, "tests.support.daemon_app:plain_queue", tmp_path, "plain")
    try:
        drain(SessionLocal, WARMUP)
        baseline = min(drain(SessionLocal, JOBS) for _ in range(ROUNDS))
    finally:
        stop(plain, tmp_path)

    # 2. The same burst with three daemons running beside the jobs.
    workers = start_pair(db_url, "tests.support.daemon_app:queue", tmp_path, "daemons")
    try:
        wait_until(
            lambda: set(running_pids(SessionLocal)) == set(DAEMON_NAMES), 30, "daemons started"
        )
        drain(SessionLocal, WARMUP)
        with_daemons = min(drain(SessionLocal, JOBS) for _ in range(ROUNDS))
        with SessionLocal() as session:
            live = [s for s in queue.daemon_status(session) if s.running]
        assert sorted(s.name for s in live) == sorted(DAEMON_NAMES)

        # 3. SIGKILL the process that runs ticker_a.
        pids = {w.pid: w for w in workers}
        victim_pid = running_pids(SessionLocal)["ticker_a"]
        assert victim_pid in pids
        victim = pids[victim_pid]
        survivor = next(w for w in workers if w is not victim)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        killed_daemons = {n for n, p in running_pids(SessionLocal).items() if p == victim_pid}
        wait_until(
            lambda: all(running_pids(SessionLocal)[name] == survivor.pid for name in DAEMON_NAMES),
            FAILOVER_BOUND + 5,
            "every daemon running on the survivor",
        )
        time.sleep(1.0)  # a few ticks on the survivor
        runs = spans(SessionLocal)
        failovers = {}
        for name in killed_daemons:
            dead = [r for r in runs[name] if r[2] == victim_pid]
            after = [r for r in runs[name] if r[2] == survivor.pid and r[0] > dead[-1][1]]
            assert len(after) == 1, (name, runs[name])  # started again once, not twice
            failovers[name] = (after[0][0] - dead[-1][1]).total_seconds()

        # 4. SIGTERM: the survivor stops its daemons and releases their rows.
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=30) == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()

    ratio = baseline / with_daemons
    print(
        f"\nordinary jobs: {JOBS / baseline:,.0f} jobs/s without daemons, "
        f"{JOBS / with_daemons:,.0f} jobs/s with 3 daemons (ratio {ratio:.2f}); "
        f"failover after SIGKILL: "
        + ", ".join(f"{n} {s:.2f} s" for n, s in sorted(failovers.items()))
        + f" (lease {DAEMON_LEASE} s)"
    )
    assert ratio >= MIN_RATIO, (baseline, with_daemons)
    assert "ticker_a" in failovers
    for name, seconds in failovers.items():
        assert 0 < seconds <= FAILOVER_BOUND, (name, seconds)

    runs = spans(SessionLocal)
    for name in DAEMON_NAMES:
        for earlier, later in itertools.pairwise(runs[name]):
            # Never two runs of one daemon at once, on any pair of processes.
            assert later[0] > earlier[1], (name, earlier, later)
    with SessionLocal() as session:
        status = queue.daemon_status(session)
        stops = session.execute(
            select(daemon_ticks.c.name).where(
                daemon_ticks.c.kind == "stop", daemon_ticks.c.pid == survivor.pid
            )
        ).scalars()
        assert sorted(stops) == sorted(DAEMON_NAMES)  # each told to stop, and it returned
    assert [(s.name, s.worker_id, s.running) for s in status] == [
        (name, None, False) for name in sorted(DAEMON_NAMES)
    ]
