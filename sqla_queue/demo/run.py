"""Orchestration of ``sqla-queue demo``: set up, place orders, run workers, check, report.

Every step is real: orders and jobs are rows in PostgreSQL, the workers are separate
``sqla-queue worker`` processes, and the closing table is computed from the database, not
from counters in this process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from sqlalchemy import Engine, bindparam, create_engine, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import BigInteger

from sqla_queue.demo import shop
from sqla_queue.models.tables import JobStatus
from sqla_queue.testing.databases import DATABASE_URL_ENV, resolve_app_url

__all__ = ["DemoError", "run_demo"]

#: Share of orders whose card is declined, so their transaction rolls back.
DECLINE_RATE = 0.05
#: Handlers running at once in each worker process.
WORKER_CONCURRENCY = 10
_QUEUE_PATH = "sqla_queue.demo.shop:queue"
_POLL_SECONDS = 0.2
# With every job due at once, a worker that makes no progress for this long is stuck.
_STALL_SECONDS = 60.0
_STOP_GRACE_SECONDS = 10.0
_GOOD_CARD = "4242424242424242"
_CHECKOUT_THREADS = 4
_SEED = 20240601


class DemoError(Exception):
    """A problem that stops the demo before it could check anything (exit status 2)."""


@dataclass
class _Placed:
    committed: list[int] = field(default_factory=list)
    declined: list[int] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _Processed:
    seconds: float
    exit_codes: list[int]
    logs: list[str]


@dataclass
class _Check:
    label: str
    value: str
    ok: bool | None = None
    note: str = ""


def run_demo(url: str | None, orders: int, workers: int) -> int:
    """Run the demo end to end and return the exit status.

    0 when every check passed, 1 when one failed, 2 when the demo could not run (bad
    arguments, no database), 130 when interrupted.
    """
    console = Console(highlight=False)
    if orders < 1 or workers < 1:
        console.print("[red]sqla-queue demo: --orders and --workers must be at least 1[/]")
        return 2
    console.rule("[bold]sqla_queue demo: a shop, its orders, and their confirmation emails")
    engine: Engine | None = None
    try:
        url, embedded = _database_url(url, console)
        engine = create_engine(url, pool_size=_CHECKOUT_THREADS)
        _reset_schema(engine, console)
        placed = _place_orders(sessionmaker(engine), orders, console)
        processed = _run_workers(engine, url, workers, len(placed.committed), console)
        checks = _check(engine, placed, processed)
    except DemoError as exc:
        console.print(f"[red]sqla-queue demo:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: worker processes stopped, nothing checked[/]")
        return 130
    finally:
        if engine is not None:
            engine.dispose()
    return _report(checks, processed, url, embedded, console)


def _database_url(explicit: str | None, console: Console) -> tuple[str, bool]:
    """The database to use, and whether it is an embedded server started for this run."""
    if explicit or os.environ.get(DATABASE_URL_ENV):
        url = resolve_app_url(explicit)
        source = "--url" if explicit else f"${DATABASE_URL_ENV}"
        console.print(f"Database ({source}): {escape(_safe(url))}", soft_wrap=True)
        return url, False
    # pgserver narrates every pg_ctl call at INFO, which would bury the demo's own output.
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    messages: list[str] = []
    try:
        with console.status(
            f"No --url and no ${DATABASE_URL_ENV}: starting an embedded PostgreSQL (pgserver); "
            "the first start initialises it and takes a few seconds..."
        ):
            url = resolve_app_url(None, announce=messages.append)
    except RuntimeError as exc:
        raise DemoError(
            f"{exc}\nOr point the demo at a server: sqla-queue demo --url postgresql://..."
        ) from exc
    for message in messages:
        console.print(escape(message), soft_wrap=True)
    return url, True


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _reset_schema(engine: Engine, console: Console) -> None:
    """Drop and recreate the demo's own schema; refuse to touch one the demo did not make."""
    schema = shop.DEMO_SCHEMA
    try:
        with engine.begin() as connection:
            comment = connection.execute(
                text(
                    "SELECT coalesce(obj_description(oid, 'pg_namespace'), '') "
                    "FROM pg_namespace WHERE nspname = :schema"
                ),
                {"schema": schema},
            ).scalar_one_or_none()
            if comment is not None and comment != shop.SCHEMA_COMMENT:
                raise DemoError(
                    f"schema {schema!r} already exists in this database and was not created by "
                    "the demo; refusing to drop it. Use another database."
                )
            verb = "Recreating" if comment is not None else "Creating"
            console.print(
                f"{verb} schema [bold]{schema}[/] (orders, confirmations and the queue's "
                "tables); nothing outside it is touched.",
                soft_wrap=True,
            )
            quoted = connection.dialect.identifier_preparer.quote_identifier(schema)
            # CASCADE only reaches objects inside the demo's own schema and their dependents.
            connection.execute(text(f"DROP SCHEMA IF EXISTS {quoted} CASCADE"))
            shop.create_tables(connection)
            # COMMENT takes no bind parameters; the text is our own constant, quoted here.
            literal = "'" + shop.SCHEMA_COMMENT.replace("'", "''") + "'"
            connection.execute(text(f"COMMENT ON SCHEMA {quoted} IS {literal}"))
    except DemoError:
        raise
    except Exception as exc:
        raise DemoError(
            f"cannot set up the demo's tables at {_safe(str(engine.url))}: {exc}"
        ) from exc


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )


def _place_one(
    session_factory: sessionmaker[Session], email: str, total_cents: int, card: str
) -> tuple[bool, int]:
    try:
        order_id = shop.place_order(
            session_factory, customer_email=email, total_cents=total_cents, card_number=card
        )
    except shop.PaymentDeclinedError as exc:
        return False, exc.order_id
    return True, order_id


def _place_orders(session_factory: sessionmaker[Session], orders: int, console: Console) -> _Placed:
    rng = random.Random(_SEED)
    declines = max(1, round(orders * DECLINE_RATE)) if orders > 1 else 0
    declined_numbers = set(rng.sample(range(orders), declines))
    plan = [
        (
            f"customer{rng.randrange(1, 1000)}@example.com",
            rng.randrange(500, 25_000),
            shop.DECLINED_CARD if number in declined_numbers else _GOOD_CARD,
        )
        for number in range(orders)
    ]
    console.print(
        f"Placing {orders:,} orders from {_CHECKOUT_THREADS} checkout threads, each in its own "
        "transaction: INSERT the order, enqueue its confirmation job, charge the card, COMMIT.",
        soft_wrap=True,
    )
    placed = _Placed()
    start = time.monotonic()
    # Threads stand in for a web shop's concurrent checkouts, each with its own Session.
    pool = ThreadPoolExecutor(_CHECKOUT_THREADS, thread_name_prefix="checkout")
    try:
        with _progress(console) as progress:
            bar = progress.add_task("Placing orders", total=orders, note="")
            futures = [pool.submit(_place_one, session_factory, *order) for order in plan]
            for future in as_completed(futures):
                committed, order_id = future.result()
                (placed.committed if committed else placed.declined).append(order_id)
                progress.update(
                    bar,
                    advance=1,
                    note=f"{len(placed.committed)} committed, {len(placed.declined)} declined",
                )
    finally:
        # On Ctrl-C, orders not yet started are dropped instead of placed in the background.
        pool.shutdown(wait=True, cancel_futures=True)
    placed.seconds = time.monotonic() - start
    console.print(
        f"{len(placed.declined)} card(s) were declined: each of those transactions rolled back "
        "the order [italic]and[/] its job.",
        soft_wrap=True,
    )
    return placed


def _status_counts(engine: Engine) -> dict[str, int]:
    jobs = shop.queue.tables.jobs
    with engine.connect() as connection:
        rows = connection.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {row[0]: row[1] for row in rows}


@contextlib.contextmanager
def _worker_processes(
    url: str, count: int
) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[IO[bytes]]]]:
    command = [
        sys.executable,
        "-m",
        "sqla_queue",
        "--log-level",
        "WARNING",
        "worker",
        _QUEUE_PATH,
        "--concurrency",
        str(WORKER_CONCURRENCY),
        "--burst",
    ]
    # The URL goes through the environment, so a password never shows up in `ps`.
    env = {**os.environ, DATABASE_URL_ENV: url}
    processes: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        logs: list[IO[bytes]] = [
            stack.enter_context(tempfile.TemporaryFile()) for _ in range(count)
        ]
        try:
            for log in logs:
                processes.append(
                    subprocess.Popen(
                        command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
                    )
                )
            yield processes, logs
        finally:
            _stop(processes)


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    running = [p for p in processes if p.poll() is None]
    for process in running:
        # SIGTERM lets a worker hand its claimed jobs back before it exits.
        process.terminate()
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _run_workers(
    engine: Engine, url: str, workers: int, expected: int, console: Console
) -> _Processed:
    console.print(
        f"Starting {workers} worker process(es): sqla-queue worker {_QUEUE_PATH} "
        f"--concurrency {WORKER_CONCURRENCY} --burst",
        soft_wrap=True,
    )
    start = time.monotonic()
    with _worker_processes(url, workers) as (processes, logs), _progress(console) as progress:
        bar = progress.add_task("Sending confirmations", total=expected, note="")
        last_done, last_change = -1, start
        while True:
            exited = all(p.poll() is not None for p in processes)
            counts = _status_counts(engine)
            done = counts.get(JobStatus.SUCCEEDED, 0) + counts.get(JobStatus.FAILED, 0)
            now = time.monotonic()
            rate = done / (now - start) if now > start else 0.0
            note = f"{rate:,.0f} jobs/s"
            if counts.get(JobStatus.FAILED):
                note += f", [red]{counts[JobStatus.FAILED]} failed[/]"
            progress.update(bar, completed=done, note=note)
            if exited:
                break
            if done != last_done:
                last_done, last_change = done, now
            elif now - last_change > _STALL_SECONDS:
                console.print(f"[red]no progress for {_STALL_SECONDS:.0f} s; stopping workers[/]")
                break
            time.sleep(_POLL_SECONDS)
        seconds = time.monotonic() - start
        _stop(processes)
        exit_codes = [p.returncode for p in processes]
        texts = []
        for log in logs:
            log.seek(0)
            texts.append(log.read().decode(errors="replace"))
    return _Processed(seconds=seconds, exit_codes=exit_codes, logs=texts)


def _check(engine: Engine, placed: _Placed, processed: _Processed) -> list[_Check]:
    """Recount everything from the database and compare it with what was placed."""
    jobs = shop.queue.tables.jobs
    orders = shop.Order.__table__
    confirmations = shop.Confirmation.__table__
    job_order_id = jobs.c.payload["kwargs"]["order_id"].astext.cast(BigInteger)
    declined = bindparam("declined", placed.declined, type_=ARRAY(BigInteger))
    committed, rolled_back = len(placed.committed), len(placed.declined)
    with engine.connect() as connection:

        def scalar(statement: object) -> int:
            return int(connection.execute(statement).scalar_one())  # type: ignore[call-overload]

        orders_in_db = scalar(select(func.count()).select_from(orders))
        jobs_in_db = scalar(select(func.count()).select_from(jobs))
        orders_with_job = scalar(select(func.count(job_order_id.distinct())))
        declined_rows = (
            scalar(select(func.count()).where(orders.c.id == func.any(declined)))
            + scalar(select(func.count()).where(job_order_id == func.any(declined)))
            + scalar(select(func.count()).where(confirmations.c.order_id == func.any(declined)))
        )
        per_order = (
            select(confirmations.c.order_id, func.count().label("n"))
            .group_by(confirmations.c.order_id)
            .subquery()
        )
        sent = scalar(select(func.count()).select_from(confirmations))
        duplicates = scalar(select(func.count()).where(per_order.c.n > 1))
        unconfirmed = scalar(
            select(func.count())
            .select_from(orders.outerjoin(per_order, per_order.c.order_id == orders.c.id))
            .where(per_order.c.order_id.is_(None))
        )
        by_worker = connection.execute(
            select(confirmations.c.worker_pid, func.count())
            .group_by(confirmations.c.worker_pid)
            .order_by(confirmations.c.worker_pid)
        ).all()
        span = connection.execute(
            select(
                func.extract(
                    "epoch", func.max(confirmations.c.sent_at) - func.min(confirmations.c.sent_at)
                )
            )
        ).scalar_one()
    status = _status_counts(engine)
    succeeded = status.get(JobStatus.SUCCEEDED, 0)
    failed = status.get(JobStatus.FAILED, 0)
    unfinished = jobs_in_db - succeeded - failed
    placed_total = committed + rolled_back
    wall = processed.seconds
    steady = (sent - 1) / float(span) if span and sent > 1 else None
    workers_note = "\n".join(f"pid {pid}: {n:,} jobs" for pid, n in by_worker)
    exits_ok = all(code == 0 for code in processed.exit_codes)
    place_rate = placed_total / placed.seconds if placed.seconds > 0 else 0.0
    return [
        _Check("Orders placed", f"{placed_total:,}", None, f"{place_rate:,.0f} orders/s"),
        _Check("  committed", f"{committed:,}", orders_in_db == committed, "order rows kept"),
        _Check(
            "  rolled back",
            f"{rolled_back:,}",
            declined_rows == 0,
            "card declined; nothing left behind"
            if declined_rows == 0
            else f"card declined; {declined_rows} rows left behind",
        ),
        _Check(
            "Jobs",
            f"{jobs_in_db:,}",
            jobs_in_db == committed and orders_with_job == committed,
            "one per committed order",
        ),
        _Check("  succeeded", f"{succeeded:,}", succeeded == committed),
        _Check("  failed", f"{failed:,}", failed == 0, "see: sqla-queue failed" if failed else ""),
        _Check("  unfinished", f"{unfinished:,}", unfinished == 0),
        _Check(
            "Confirmations sent",
            f"{sent:,}",
            unconfirmed == 0,
            f"{unconfirmed} orders without one",
        ),
        _Check("  duplicates", f"{duplicates:,}", duplicates == 0, "orders confirmed twice"),
        _Check(
            "Worker processes",
            str(len(processed.exit_codes)),
            exits_ok,
            workers_note if exits_ok else f"exit codes {processed.exit_codes}",
        ),
        _Check("Processing time", f"{wall:.1f} s", None, "incl. worker start-up"),
        _Check(
            "Throughput",
            f"{succeeded / wall:,.0f} jobs/s" if wall > 0 else "-",
            None,
            f"first to last job: {steady:,.0f}/s" if steady else "",
        ),
    ]


def _report(
    checks: list[_Check], processed: _Processed, url: str, embedded: bool, console: Console
) -> int:
    table = Table(title="Summary (recounted from the database)", title_justify="left")
    table.add_column("")
    table.add_column("", justify="right")
    table.add_column("check", justify="center")
    table.add_column("details")
    for check in checks:
        mark = "" if check.ok is None else ("[green]✓[/]" if check.ok else "[red]✗[/]")
        table.add_row(check.label, check.value, mark, check.note)
    console.print(table)
    failed = [c.label.strip() for c in checks if c.ok is False]
    if failed:
        for number, log in enumerate(processed.logs, start=1):
            if log.strip():
                tail = "\n".join(log.strip().splitlines()[-20:])
                console.print(f"[bold]worker {number} output (last lines):[/]\n{escape(tail)}")
    if failed:
        console.print(f"[red bold]{len(failed)} check(s) failed:[/] {', '.join(failed)}")
        return 1
    console.print(
        "[green bold]All checks passed[/]: every committed order got exactly one confirmation, "
        "and no declined order left a job behind.",
        soft_wrap=True,
    )
    console.print(f"The shop's code: {escape(str(shop.__file__))}", soft_wrap=True)
    if embedded:
        console.print(
            "The embedded server stops when the demo exits; its data directory is kept for "
            "the next run.",
            soft_wrap=True,
        )
    else:
        console.print(
            f"Look around: sqla-queue verify {_QUEUE_PATH} --url '{escape(_safe(url))}'",
            soft_wrap=True,
        )
    return 0
