"""The daemon supervisor: a worker service that keeps the queue's daemons running.

Every worker of a queue with daemons runs one :class:`DaemonSupervisor`. Its thread takes
free daemon instances (rows of ``daemons`` that nobody holds, or whose holder's lease ran
out), starts each in a thread of its own (``def``) or on an event loop of its own in a
thread (``async def``; see :mod:`sqla_queue.worker.daemon_runs`), renews the leases of
those it runs at a quarter of their length, restarts a crashed instance after a backoff,
and on a graceful stop asks each instance to stop, waits for them, and releases their rows
so that another worker takes them at once. Nothing of this touches the worker's handler
pool: ``concurrency`` stays whole.

Ownership is fenced twice. In the database: a renewal only extends a row that still names
this worker under an unexpired lease, and an instance missing from its result is told to
stop and is not restarted here. Locally: an instance whose lease was not renewed in time
(the database was unreachable) is told to stop a tenth of a lease before the lease ends,
so by the time another worker may take it, it has had that long to return. A daemon that
ignores the request cannot be stopped (threads cannot be killed), so daemons must watch
``ctx.shutdown_requested``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from sqla_queue.daemons import DaemonContext, DaemonSpec
from sqla_queue.statements.daemons import (
    AcquireDaemonsParams,
    DaemonCrashParams,
    EnsureDaemonsParams,
    ReleaseDaemonsParams,
    RenewDaemonsParams,
    acquire_daemons_statement,
    daemon_crash_statement,
    ensure_daemons_statement,
    release_daemons_statement,
    renew_daemons_statement,
)
from sqla_queue.worker.daemon_runs import daemon_context, daemon_thread
from sqla_queue.worker.services import ServiceEnv
from sqla_queue.worker.threads import WorkerThread

__all__ = ["FENCE_MARGIN", "DaemonSupervisor"]

log = logging.getLogger("sqla_queue.worker")

#: The part of a lease by which a local run is stopped before its lease ends when it could
#: not be renewed: the time a daemon has to return before another worker may start it.
FENCE_MARGIN = 0.1
#: Longest sleep of the supervisor's loop: how late it sees the worker's stop flag.
MAX_TICK = 0.1
#: Wait before trying a failed renewal again (never later than the renewal was due).
RETRY_DELAY = 0.5
#: Longest error text kept in ``last_error``.
MAX_ERROR_TEXT = 2000

Key = tuple[str, int]


@dataclass(eq=False)
class _Instance:
    """One daemon instance this worker holds: its lease, its current run, its crashes."""

    spec: DaemonSpec
    number: int
    lease: float
    #: Monotonic time at which the local run must be told to stop if not renewed by then.
    deadline: float
    context: DaemonContext | None = None
    thread: threading.Thread | None = None
    started: float = 0.0
    error: BaseException | None = None
    crashes: int = 0
    restart_at: float | None = None
    #: Lost to another worker (or never renewed in time): stop, never restart here.
    fenced: bool = False

    @property
    def key(self) -> Key:
        return (self.spec.name, self.number)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class DaemonSupervisor(WorkerThread):
    """Runs the queue's daemons on one worker: a worker service (a
    :class:`~sqla_queue.worker.threads.WorkerThread`).

    Build it with the worker's :class:`~sqla_queue.worker.services.ServiceEnv` and the
    queue's :class:`~sqla_queue.daemons.DaemonSpec` list; the worker calls :meth:`start`,
    then :meth:`request_stop` and :meth:`join`. On a stop request, or when the worker's
    ``stop_flag`` is set, its thread asks every daemon instance to stop, then releases
    their rows. A database error is logged and the step tried again at its next turn;
    nothing here stops the worker.
    """

    thread_name = "sqla-queue-daemons"

    def __init__(
        self,
        env: ServiceEnv,
        specs: Sequence[DaemonSpec],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not specs:
            raise ValueError("DaemonSupervisor needs at least one daemon")
        self.env = env
        self.specs = {spec.name: spec for spec in specs}
        self.leases = {spec.name: spec.lease(env.lease) for spec in specs}
        shortest = min(self.leases.values())
        #: Seconds between renewals of the leases held.
        self.renew_interval = shortest / 4
        #: Seconds between looks for free instances (a dead worker's, a released one).
        self.acquire_interval = max(min(env.maintenance_interval, shortest / 4), 0.05)
        self._clock = clock
        self._held: dict[Key, _Instance] = {}
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._ensured = False
        tables = env.tables
        self._ensure = ensure_daemons_statement(tables)
        self._acquire_stmt = acquire_daemons_statement(tables)
        self._renew_stmt = renew_daemons_statement(tables)
        self._release_stmt = release_daemons_statement(tables)
        self._crash_stmt = daemon_crash_statement(tables)
        super().__init__(stop_flag=env.stop_flag)

    # -- observation (tests, diagnostics) --------------------------------------------------

    def running(self) -> list[Key]:
        """The (name, instance) pairs whose run is alive on this worker right now."""
        with self._lock:
            return sorted(key for key, inst in self._held.items() if inst.alive)

    # -- the supervisor's thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._supervise()
            self._shut_down()
        except BaseException:
            log.exception("the daemon supervisor failed; its daemons stop")
            for inst in self._instances():
                if inst.context is not None:
                    inst.context.request_stop()
        finally:
            self._discard_connection()

    def _supervise(self) -> None:
        clock = self._clock
        next_acquire = clock()
        next_renew = clock() + self.renew_interval
        while not self.stopping():
            now = clock()
            self._reap(now)
            self._fence_expired(now)
            if now >= next_renew:
                renewed = self._renew()
                next_renew = now + (
                    self.renew_interval if renewed else min(RETRY_DELAY, self.renew_interval)
                )
            if now >= next_acquire and not self.stopping():
                self._acquire()
                next_acquire = now + self.acquire_interval
            self._restart_due(clock())
            self._sleep(min(next_acquire, next_renew, self._next_event()))

    def _shut_down(self) -> None:
        """Stop every instance, keep their leases while they finish, then release them."""
        for inst in self._instances():
            inst.restart_at = None
            if inst.context is not None:
                inst.context.request_stop()
        clock = self._clock
        deadline = clock() + self.env.shutdown_timeout
        next_renew = clock() + self.renew_interval
        while any(inst.alive for inst in self._instances()) and clock() < deadline:
            now = clock()
            self._fence_expired(now)
            if now >= next_renew:
                renewed = self._renew(only_alive=True)
                next_renew = now + (
                    self.renew_interval if renewed else min(RETRY_DELAY, self.renew_interval)
                )
            self._sleep(min(deadline, next_renew, self._next_event()))
        ended = [inst for inst in self._instances() if not inst.alive]
        stuck = [inst for inst in self._instances() if inst.alive]
        for inst in stuck:
            log.warning(
                "daemon %s[%s] did not stop within the shutdown timeout (%.1f s); its lease "
                "lapses within %.1f s and another worker may then start it",
                inst.spec.name,
                inst.number,
                self.env.shutdown_timeout,
                inst.lease,
            )
        self._release([inst.key for inst in ended])
        for inst in ended:
            self._report_end(inst)
        with self._lock:
            for inst in ended:
                self._held.pop(inst.key, None)

    def _sleep(self, until: float) -> None:
        # Never longer than MAX_TICK: the worker's stop flag wakes nobody.
        timeout = min(max(until - self._clock(), 0.0), MAX_TICK)
        if timeout > 0:
            self.wait_for_wake(timeout)

    def _next_event(self) -> float:
        """The earliest local deadline or scheduled restart (infinity when none)."""
        times = [float("inf")]
        for inst in self._instances():
            if not inst.fenced:
                times.append(inst.deadline)
            if inst.restart_at is not None:
                times.append(inst.restart_at)
        return min(times)

    def _instances(self) -> list[_Instance]:
        with self._lock:
            return list(self._held.values())

    # -- database steps --------------------------------------------------------------------

    def _execute(self, statement: Any, params: Any) -> list[Any]:
        """Run one statement on the supervisor's own autocommit connection."""
        if self._connection is None:
            self._connection = self.env.engine.connect().execution_options(
                isolation_level="AUTOCOMMIT"
            )
        try:
            result = self._connection.execute(statement, params)
            return list(result.all()) if result.returns_rows else []
        except BaseException:
            self._discard_connection(broken=True)
            raise

    def _discard_connection(self, broken: bool = False) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            if broken:  # never hand a connection in an unknown state back to the pool
                connection.invalidate()
            connection.close()
        except Exception:
            log.debug("closing the daemon supervisor's connection failed", exc_info=True)

    def _ensure_rows(self) -> None:
        names: list[str] = []
        numbers: list[int] = []
        for spec in self.specs.values():
            names.extend([spec.name] * spec.instances)
            numbers.extend(range(spec.instances))
        self._execute(self._ensure, EnsureDaemonsParams(names=names, instances=numbers))
        self._ensured = True

    def _acquire(self) -> None:
        """Take the free instances of this worker's daemons and start them."""
        try:
            if not self._ensured:
                self._ensure_rows()
            busy = [inst.key for inst in self._instances()]
            params = AcquireDaemonsParams(
                worker=self.env.worker_id,
                names=list(self.specs),
                counts=[spec.instances for spec in self.specs.values()],
                leases=[self.leases[name] for name in self.specs],
                busy_names=[name for name, _ in busy],
                busy_instances=[number for _, number in busy],
            )
            sent = self._clock()
            rows = self._execute(self._acquire_stmt, params)
        except Exception as exc:
            log.warning("daemons: looking for free instances failed (%s); trying again", exc)
            return
        for row in rows:
            spec = self.specs[row.name]
            lease = self.leases[spec.name]
            inst = _Instance(spec, row.instance, lease, self._deadline(sent, lease))
            with self._lock:
                self._held[inst.key] = inst
            log.info(
                "daemon %s[%s] acquired by worker %s", spec.name, inst.number, self.env.worker_id
            )
            if not self.stopping():  # else it is released with the others, never started
                self._launch(inst)

    def _renew(self, only_alive: bool = False) -> bool:
        """Extend the leases of the instances held; stop those no longer this worker's.

        Returns False when the database could not be reached (try again soon).
        """
        held = [
            inst for inst in self._instances() if not inst.fenced and (inst.alive or not only_alive)
        ]
        if not held:
            return True
        params = RenewDaemonsParams(
            worker=self.env.worker_id,
            names=[inst.spec.name for inst in held],
            instances=[inst.number for inst in held],
            leases=[inst.lease for inst in held],
        )
        sent = self._clock()
        try:
            rows = self._execute(self._renew_stmt, params)
        except Exception as exc:
            log.warning("daemons: renewing the leases failed (%s); trying again", exc)
            return False
        renewed = {(row.name, row.instance) for row in rows}
        for inst in held:
            if inst.key in renewed:
                inst.deadline = self._deadline(sent, inst.lease)
            else:
                self._fence(inst, "its lease was taken over by another worker")
        return True

    def _release(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        if not keys:
            return
        params = ReleaseDaemonsParams(
            worker=self.env.worker_id,
            names=[name for name, _ in keys],
            instances=[number for _, number in keys],
        )
        for attempt in range(3):
            try:
                self._execute(self._release_stmt, params)
                return
            except Exception as exc:
                log.warning("daemons: releasing %s failed (%s)", keys, exc)
                time.sleep(0.1 * (attempt + 1))
        log.warning("daemons: %s stay held until their leases lapse", keys)

    def _record_crash(self, inst: _Instance, error: BaseException) -> None:
        text = f"{type(error).__name__}: {error}"[:MAX_ERROR_TEXT].replace("\x00", "")
        params = DaemonCrashParams(
            worker=self.env.worker_id, daemon=inst.spec.name, number=inst.number, error=text
        )
        try:
            self._execute(self._crash_stmt, params)
        except Exception as exc:
            log.warning("daemons: recording the crash of %s failed (%s)", inst.key, exc)

    @staticmethod
    def _deadline(sent: float, lease: float) -> float:
        # ``sent`` is before the database's now(), so the database's lease ends later still.
        return sent + lease * (1 - FENCE_MARGIN)

    # -- local runs ------------------------------------------------------------------------

    def _fence(self, inst: _Instance, why: str) -> None:
        inst.fenced = True
        inst.restart_at = None
        log.warning("daemon %s[%s] stops here: %s", inst.spec.name, inst.number, why)
        if inst.context is not None:
            inst.context.request_stop()
        if not inst.alive:
            with self._lock:
                self._held.pop(inst.key, None)

    def _fence_expired(self, now: float) -> None:
        for inst in self._instances():
            if not inst.fenced and now >= inst.deadline:
                self._fence(inst, "its lease could not be renewed in time")

    def _reap(self, now: float) -> None:
        """Handle the runs that ended: schedule a restart, or forget a fenced instance."""
        for inst in self._instances():
            if inst.thread is None or inst.thread.is_alive():
                continue
            inst.thread = None
            if inst.fenced:
                with self._lock:
                    self._held.pop(inst.key, None)
                continue
            if self.stopping():
                continue  # the shutdown reports how it ended
            error, inst.error = inst.error, None
            if error is not None:
                inst.crashes = inst.spec.backoff.crashes_after(inst.crashes, now - inst.started)
                delay = inst.spec.backoff.delay(inst.crashes)
                log.error(
                    "daemon %s[%s] raised %s: %s; restarting in %.1f s",
                    inst.spec.name,
                    inst.number,
                    type(error).__name__,
                    error,
                    delay,
                    exc_info=(type(error), error, error.__traceback__),
                )
                self._record_crash(inst, error)
            else:
                inst.crashes = 0
                delay = inst.spec.backoff.min_delay
                log.warning(
                    "daemon %s[%s] returned; a daemon runs until it is asked to stop, so it "
                    "restarts in %.1f s",
                    inst.spec.name,
                    inst.number,
                    delay,
                )
            inst.restart_at = now + delay

    def _restart_due(self, now: float) -> None:
        for inst in self._instances():
            if (
                inst.restart_at is not None
                and inst.restart_at <= now
                and not inst.fenced
                and inst.thread is None
                and now < inst.deadline
                and not self.stopping()
            ):
                inst.restart_at = None
                self._launch(inst)

    def _report_end(self, inst: _Instance) -> None:
        error = inst.error
        if error is not None:
            log.warning(
                "daemon %s[%s] raised %s while stopping: %s",
                inst.spec.name,
                inst.number,
                type(error).__name__,
                error,
            )

    def _launch(self, inst: _Instance) -> None:
        inst.context = daemon_context(inst.spec, inst.number, self.env)
        inst.error = None
        inst.started = self._clock()
        inst.thread = daemon_thread(inst.spec, inst.context, lambda error: self._ended(inst, error))
        inst.thread.start()

    def _ended(self, inst: _Instance, error: BaseException | None) -> None:
        """A run ended (called on its thread): keep how, and wake the supervisor."""
        inst.error = error
        self.wake()
