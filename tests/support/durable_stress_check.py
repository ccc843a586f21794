"""The accounting of a durable stress run (:mod:`tests.support.durable_stress`).

:func:`verify_stress` reads the jobs, their ``StepWrite`` rows, checkpoints, signals and
recorded resumptions after the drain and checks, job by job: it succeeded with the result
its plan implies; every step's write is there once (the primary key allows no second
one, the count proves the first) with the step's value, and ``job_steps`` holds exactly
the planned steps and waits; no attempt failed on a duplicate write; a signal job
returned, and wrote, the payload of its first signal, which ``job_signals`` holds once; a
second send stored nothing and woke nobody; and every run past the wait beyond one is
explained by a SIGKILL or by a failed attempt recorded in the job's errors. Then the run:
no execution is left, and no sample saw a suspended execution hold a worker or a seat, or
the limited task above its limit.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from tests.support.chaos import CLOCK_SLACK, WorkerLife
from tests.support.durable_stress import (
    LIMIT,
    SIGNAL,
    PlannedJob,
    Send,
    StressRun,
    expected_steps,
    expected_waits,
    table_sql,
)

__all__ = ["StressReport", "summary", "verify_stress"]

#: Error types an attempt may fail with under the run's faults: its connection was cut,
#: or its execution was reclaimed while it ran (a live worker cut off by a sweep).
ALLOWED_ERRORS = frozenset(
    {
        "sqlalchemy.exc.OperationalError",
        "sqlalchemy.exc.InterfaceError",
        "sqlalchemy.exc.PendingRollbackError",
        "sqla_queue.errors.StepNotCommittedError",
    }
)

_LOG_MARKERS = {
    "reclaim sweeps": "lost execution(s) of dead workers",
    "lost while held": "reclaimed by another worker while held here",
    "results discarded": "result discarded",
}


@dataclass
class StressReport:
    """The accounting of a run; ``problems`` is empty when everything adds up."""

    jobs: Counter[str] = field(default_factory=Counter)
    succeeded: int = 0
    step_writes: int = 0
    waits: int = 0
    resumed_runs: int = 0
    extra_by_kill: int = 0
    extra_by_error: int = 0
    #: First sends that woke a suspended job / found it not (yet) waiting.
    woke: int = 0
    before_wait: int = 0
    repeats: int = 0
    error_types: Counter[str] = field(default_factory=Counter)
    log_counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def problem(self, message: str) -> None:
        """Note one discrepancy."""
        self.problems.append(message)


@dataclass(frozen=True)
class _Resumed:
    attempt: int
    pid: int
    payload: Any
    at: float


@dataclass
class _Loaded:
    jobs: dict[int, Any]
    writes: dict[int, dict[str, str | None]]
    steps: dict[int, dict[str, tuple[str, Any]]]
    signals: dict[int, list[tuple[str, Any]]]
    resumed: dict[int, list[_Resumed]]
    executions: int


def _load(conn: Connection, ids: list[int]) -> _Loaded:
    params = {"ids": ids}
    jobs = {
        int(r.id): r
        for r in conn.execute(
            text(
                table_sql(
                    "SELECT id, task, status, attempts, result, errors FROM {s}.{p}jobs "
                    "WHERE id = ANY(:ids)"
                )
            ),
            params,
        )
    }
    writes: dict[int, dict[str, str | None]] = defaultdict(dict)
    for job_id, step, value in conn.execute(text("SELECT job_id, step, value FROM step_writes")):
        writes[int(job_id)][step] = value
    steps: dict[int, dict[str, tuple[str, Any]]] = defaultdict(dict)
    for job_id, name, kind, result in conn.execute(
        text(table_sql("SELECT job_id, name, kind, result FROM {s}.{p}job_steps"))
    ):
        steps[int(job_id)][name] = (kind, result)
    signals: dict[int, list[tuple[str, Any]]] = defaultdict(list)
    for job_id, name, payload in conn.execute(
        text(table_sql("SELECT job_id, name, payload FROM {s}.{p}job_signals"))
    ):
        signals[int(job_id)].append((name, payload))
    resumed: dict[int, list[_Resumed]] = defaultdict(list)
    for job_id, attempt, pid, payload, at in conn.execute(
        text(
            "SELECT job_id, attempt, pid, payload, extract(epoch FROM at) FROM ds_runs "
            "WHERE phase = 'resumed' ORDER BY id"
        )
    ):
        resumed[int(job_id)].append(_Resumed(int(attempt), int(pid), payload, float(at)))
    left = conn.execute(text(table_sql("SELECT count(*) FROM {s}.{p}job_executions")))
    return _Loaded(jobs, writes, steps, signals, resumed, int(left.scalar_one()))


def _expected_result(job: PlannedJob, payload: Any) -> Any:
    if job.task == "ds_steps":
        return sum(i * i for i in range(job.kwargs["steps"]))
    if job.task == "ds_limited":
        return len(job.kwargs["naps"]) + 1
    return payload


class _Verifier:
    def __init__(self, run: StressRun, loaded: _Loaded, report: StressReport) -> None:
        self.run = run
        self.loaded = loaded
        self.report = report
        self.sends: dict[int, list[Send]] = defaultdict(list)
        for send in run.sends:
            self.sends[send.job_id].append(send)
        self.lives_by_pid: dict[int, list[WorkerLife]] = defaultdict(list)
        for life in run.lives:
            self.lives_by_pid[life.pid].append(life)

    def check(self) -> None:
        """Every check, every job."""
        report, loaded = self.report, self.loaded
        if loaded.executions:
            report.problem(f"{loaded.executions} executions left after the drain")
        missing = set(self.run.jobs) - set(loaded.jobs)
        if missing:
            report.problem(f"{len(missing)} jobs missing, e.g. {sorted(missing)[:5]}")
        strays = (set(loaded.writes) | set(loaded.steps) | set(loaded.resumed)) - set(self.run.jobs)
        if strays:
            report.problem(f"rows written for jobs of no plan: {sorted(strays)[:5]}")
        for job_id, planned in sorted(self.run.jobs.items()):
            row = loaded.jobs.get(job_id)
            if row is not None:
                self.check_job(job_id, planned, row)
        self.check_samples()

    def check_job(self, job_id: int, planned: PlannedJob, row: Any) -> None:
        """One job's status, result, errors, step writes and checkpoints."""
        report = self.report
        here = f"job {job_id} ({planned.task})"
        report.jobs[planned.task] += 1
        errors: list[dict[str, Any]] = row.errors or []
        for entry in errors:
            kind = str(entry.get("type"))
            report.error_types[kind] += 1
            if kind not in ALLOWED_ERRORS:
                # A second commit of a step's write shows here (IntegrityError), even when
                # a retry then succeeded.
                report.problem(
                    f"{here}: attempt {entry.get('attempt')} failed: {kind}: "
                    f"{str(entry.get('message'))[:300]}"
                )
        payload = None
        if planned.task == "ds_signal":
            payload = self.check_signal(here, job_id, planned)
        if row.status != "succeeded":
            report.problem(f"{here}: status {row.status}, errors {json.dumps(errors)[:500]}")
            return
        report.succeeded += 1
        if row.result != _expected_result(planned, payload):
            report.problem(
                f"{here}: result {row.result!r}, expected {_expected_result(planned, payload)!r}"
            )
        want = expected_steps(planned)
        if "after" in want:
            want["after"] = payload
        writes = self.loaded.writes.get(job_id, {})
        report.step_writes += len(writes)
        if set(writes) != set(want):
            report.problem(f"{here}: step writes {sorted(writes)}, expected {sorted(want)}")
        for name, value in want.items():
            if name in writes and writes[name] != json.dumps(value):
                report.problem(f"{here}: step {name} wrote {writes[name]!r}, expected {value!r}")
        stored = self.loaded.steps.get(job_id, {})
        done = {name: result for name, (kind, result) in stored.items() if kind == "step"}
        if done != want:
            report.problem(f"{here}: job_steps steps {done}, expected {want}")
        waits = {name for name, (kind, _) in stored.items() if kind == "wait"}
        report.waits += len(waits)
        must, may = expected_waits(planned)
        if not must <= waits <= must | may or len(stored) != len(done) + len(waits):
            report.problem(f"{here}: job_steps {sorted(stored)}, waits {sorted(waits)}")

    def check_signal(self, here: str, job_id: int, planned: PlannedJob) -> Any:
        """The signal's sends, its stored row and the runs past the wait; the payload
        the job must have received (its first send's)."""
        report = self.report
        sends = self.sends.get(job_id, [])
        firsts = [s for s in sends if not s.repeat]
        if not firsts:
            report.problem(f"{here}: its signal was never sent")
            return None
        payload = firsts[0].payload
        done = [s for s in firsts if s.error is None]
        if not done:
            report.problem(f"{here}: every send of its signal failed")
        elif done[0] is firsts[0]:
            # Not after a send that may have committed: this one stored the signal.
            first = done[0]
            if not first.stored:
                report.problem(f"{here}: the first send stored nothing ({first})")
            if first.woke:
                report.woke += 1
            elif planned.signal == "late":
                # Sent while the job was seen suspended for it: nothing else wakes it.
                report.problem(f"{here}: a late signal did not wake the waiting job ({first})")
            elif first.status == "queued":
                report.before_wait += 1
        for send in sends:
            if send.repeat and send.error is None:
                report.repeats += 1
                if send.stored or send.woke:
                    report.problem(f"{here}: a second send stored or woke: {send}")
        woke = [s for s in sends if s.woke]
        if len(woke) > 1:
            report.problem(f"{here}: {len(woke)} sends woke the job")
        signals = self.loaded.signals.get(job_id, [])
        if signals != [(SIGNAL, payload)]:
            report.problem(f"{here}: job_signals {signals}, expected one {payload!r}")
        self.check_resumed(here, job_id, payload)
        return payload

    def check_resumed(self, here: str, job_id: int, payload: Any) -> None:
        """Every run past the wait saw the first payload; runs beyond one per attempt
        that ended are explained by a SIGKILL."""
        report = self.report
        runs = self.loaded.resumed.get(job_id, [])
        report.resumed_runs += len(runs)
        row = self.loaded.jobs[job_id]
        if not runs and row.status == "succeeded":
            report.problem(f"{here}: succeeded without a run past its wait")
        for r in runs:
            if r.payload != payload:
                report.problem(f"{here}: a run past the wait got {r.payload!r}, not {payload!r}")
        failed = {e.get("attempt") for e in (row.errors or [])}
        by_attempt: dict[int, list[_Resumed]] = defaultdict(list)
        for r in runs:
            by_attempt[r.attempt].append(r)
        for attempt, group in sorted(by_attempt.items()):
            ended = attempt == row.attempts or attempt in failed
            for i, r in enumerate(group):
                if ended and i == len(group) - 1:
                    if attempt in failed and attempt != row.attempts:
                        report.extra_by_error += 1
                    continue
                if self.killed_during(r):
                    report.extra_by_kill += 1
                else:
                    report.problem(
                        f"{here}: attempt {attempt} ran past the wait {len(group)} time(s), "
                        f"not ended and not killed (pid {r.pid})"
                    )

    def killed_during(self, r: _Resumed) -> bool:
        """Whether ``r`` ran in a process that was SIGKILLed later in its life."""
        return any(
            life.killed
            and life.started_at - CLOCK_SLACK <= r.at <= (life.ended_at or 0) + CLOCK_SLACK
            for life in self.lives_by_pid.get(r.pid, [])
        )

    def check_samples(self) -> None:
        """No sample saw a suspended execution hold anything, or the limit exceeded."""
        report, sample = self.report, self.run.sample
        for at, job_id, wait, worker, slot in sample.holding[:10]:
            report.problem(
                f"at {at:.1f}s job {job_id} was suspended ({wait}) holding worker {worker}, "
                f"slot {slot}"
            )
        for at, running, seats in sample.over_limit[:10]:
            report.problem(
                f"at {at:.1f}s {running} ds_limited executions ran, {seats} held a seat "
                f"(limit {LIMIT})"
            )


def verify_stress(db_url: str, run: StressRun) -> StressReport:
    """Account for every job of ``run`` (see the module docstring)."""
    report = StressReport()
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            loaded = _load(conn, sorted(run.jobs))
    finally:
        engine.dispose()
    _Verifier(run, loaded, report).check()
    for life in run.lives:
        if life.unexpected:
            report.problem(f"worker pid {life.pid} exited on its own (code {life.returncode})")
        elif not life.killed and life.returncode != 0:
            report.problem(f"worker pid {life.pid} exited with {life.returncode} after SIGTERM")
        log = life.log_path.read_text(errors="replace") if life.log_path.exists() else ""
        for name, marker in _LOG_MARKERS.items():
            report.log_counts[name] += log.count(marker)
    return report


def summary(run: StressRun, report: StressReport) -> str:
    """A few lines for humans: the faults, the mix, and how the jobs came out."""
    sample = run.sample
    drain = f"{run.drain_seconds:.1f}s" if run.drain_seconds is not None else "did not drain"
    sweeps = ", ".join(f"{n} at {at:.0f}s" for at, n in run.terminations) or "none"
    lines = [
        f"seed {run.config.seed}: jobs {dict(report.jobs)}, succeeded {report.succeeded}, "
        f"drain {drain}, stop after SIGTERM {run.stop_seconds:.1f}s",
        f"processes: {len(run.lives)} lives, {len(run.kills)} SIGKILLs; backends "
        f"terminated: {sweeps}",
        f"steps written {report.step_writes}, waits {report.waits}; signals: {report.woke} "
        f"woke a waiting job, {report.before_wait} came before the wait, {report.repeats} "
        f"repeats, {sum(1 for s in run.sends if s.error)} sends cut",
        f"runs past the wait: {report.resumed_runs} ({report.extra_by_kill} extra by a kill, "
        f"{report.extra_by_error} by a failed attempt)",
        f"samples {sample.count}: at most {sample.max_suspended} suspended, ds_limited at "
        f"most {sample.max_limited_running} running / {sample.max_limited_seats} seats / "
        f"{sample.max_limited_suspended} suspended",
        f"errors: {dict(report.error_types) or 'none'}; worker logs: {dict(report.log_counts)}",
        f"problems: {len(report.problems)}",
        *(f"  {p}" for p in report.problems[:25]),
    ]
    return "\n".join(lines)
