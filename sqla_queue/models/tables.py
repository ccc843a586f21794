"""The queue's tables, built into the host application's own MetaData.

``jobs`` is the durable record of every request: arguments, outcome, error history. It is
written at enqueue and again when the job reaches a final state (or fails an attempt).

``job_executions`` is the live, narrow, hot table: one row while a job is pending or running,
deleted when the job finishes. Claims, heartbeats and reclaims touch only this table, which
keeps their cost (and vacuum's) independent of how much history ``jobs`` holds.

``task_limits`` holds the concurrency limits stored at run time, and ``unique_keys``
(schema version 4) the unique job keys, one row per key: only the enqueues of unique jobs
read or write it.

Version 5 adds time and capacity: ``task_controls`` (a paused flag and a rate limit per
task, stored at run time), ``rate_starts`` (the recent starts of rate-limited tasks, by the
database clock), ``schedules`` (each periodic schedule's last enqueued tick) and
``daemons`` (each daemon instance's current owner and lease) and ``workers`` (the live
workers, for ``sqla-queue status`` and the dashboard). Only the features that use them read
or write them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import conv

from sqla_queue._identifiers import validate_prefix, validate_schema
from sqla_queue.errors import InvalidIdentifierError
from sqla_queue.models._storage import set_storage_parameters

__all__ = [
    "DEFAULT_PREFIX",
    "SCHEMA_VERSION",
    "HistoryLayout",
    "JobStatus",
    "QueueTables",
    "UniqueScope",
    "build_tables",
    "check_history",
    "parse_schema_version_comment",
    "resolve_schema",
    "schema_version_comment",
    "translated_schema",
]

DEFAULT_PREFIX = "sqla_queue_"

#: The schema version that these models describe. Each released version is frozen in
#: ``alembic_ext`` so that an old migration never changes meaning.
SCHEMA_VERSION = 5

# How the executions table's comment records the schema version, written and read here only.
_VERSION_COMMENT = "sqla_queue schema version {}"
_VERSION_ANYWHERE = re.compile(r"sqla_queue schema version (\d+)")
_VERSION_EXACT = re.compile(rf"^{_VERSION_ANYWHERE.pattern}$")


class JobStatus:
    """Values of ``jobs.status``. A job is ``queued`` while its execution row exists."""

    QUEUED = "queued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ALL = (QUEUED, SUCCEEDED, FAILED, CANCELLED)


class HistoryLayout:
    """Where finished jobs live: the values of ``Queue(history=...)``.

    ``plain``: one ``jobs`` table holds every job, and ``prune`` deletes old rows.
    ``partitioned``: ``jobs`` is partitioned by status; the queued jobs live in
    ``jobs_live``, the finished ones in time-range partitions of ``jobs_done`` (succeeded
    and cancelled) and ``jobs_failed``, and ``prune`` drops whole partitions
    (see :mod:`sqla_queue.history`).
    """

    PLAIN = "plain"
    PARTITIONED = "partitioned"
    ALL = (PLAIN, PARTITIONED)


def check_history(history: object) -> str:
    """``history`` if it names a :class:`HistoryLayout`, else a ``ValueError`` listing them."""
    if history not in HistoryLayout.ALL:
        raise ValueError(
            f"history must be one of {', '.join(map(repr, HistoryLayout.ALL))}, got {history!r}"
        )
    return str(history)


class ExecutionState:
    """Values of ``job_executions.state``.

    ``pending`` rows are claimable once due; ``running`` ones are held by a worker. The
    other two exist only for jobs with a ``queue_id`` (schema version 3): ``waiting`` is a
    job queued behind an earlier job of its key, kept out of the claim's indexes until the
    key's turn comes; ``done`` is a finished execution that could not be deleted at once
    because an enqueue in flight holds it as the predecessor of a new waiting job (the next
    maintenance sweep deletes it and promotes the key's next job).
    """

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    ALL = (PENDING, RUNNING, WAITING, DONE)


class UniqueScope:
    """Values of ``unique_keys.scope``: how long a job holds its unique key.

    ``queued``: until it starts running; ``active``: until it finishes; ``finished``:
    until ``hold_seconds`` after it finished. A cancelled job gives its key up at once.
    """

    QUEUED = "queued"
    ACTIVE = "active"
    FINISHED = "finished"
    ALL = (QUEUED, ACTIVE, FINISHED)


def schema_version_comment(version: int) -> str:
    """The table comment that records the schema version on ``job_executions``."""
    return _VERSION_COMMENT.format(version)


def parse_schema_version_comment(comment: str | None, *, anywhere: bool = False) -> int | None:
    """The schema version that a ``job_executions`` table comment records, else ``None``.

    The inverse of :func:`schema_version_comment`. By default the comment must be exactly
    what that function writes (as Alembic's autogenerate sees it on a table it drops);
    ``anywhere=True`` also finds the marker inside a longer comment (as the startup check
    reads it from the catalog).
    """
    pattern = _VERSION_ANYWHERE if anywhere else _VERSION_EXACT
    match = pattern.search(comment or "")
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class QueueTables:
    """The Core tables of one queue, plus the names derived from its prefix.

    ``schema`` is the queue's effective schema (see :func:`resolve_schema`): the one its
    tables carry, ``None`` for the search path.
    """

    jobs: Table
    executions: Table
    limits: Table
    unique_keys: Table
    controls: Table
    rate_starts: Table
    schedules: Table
    daemons: Table
    workers: Table
    schema: str | None
    prefix: str
    #: The :class:`HistoryLayout` of the jobs table.
    history: str = HistoryLayout.PLAIN
    #: Where a connection's ``schema_translate_map`` puts the tables (one name), or empty
    #: when no map moves them: see :meth:`translated`.
    moved_to: tuple[str | None, ...] = ()

    @property
    def all(self) -> tuple[Table, ...]:
        """Every table of the queue, in creation order (each one's referents first)."""
        return (
            self.jobs,
            self.executions,
            self.limits,
            self.unique_keys,
            self.controls,
            self.rate_starts,
            self.schedules,
            self.daemons,
            self.workers,
        )

    @property
    def effective_schema(self) -> str | None:
        """The schema the rows are in for the connections these tables serve: ``schema``,
        or the one a ``schema_translate_map`` moved it to (see :meth:`translated`)."""
        return self.moved_to[0] if self.moved_to else self.schema

    def translated(self, translate_map: Mapping[Any, Any] | None) -> QueueTables:
        """These tables as a connection with the ``schema_translate_map`` option sees them.

        SQLAlchemy moves the tables' statements to the translated schema; every name that
        the library derives from the schema itself (the NOTIFY channels, the advisory lock
        keys) must move with them, or two tenants of one queue would wake, wait for and
        answer each other. The copy names the translated schema in
        :attr:`effective_schema`; ``schema`` stays the declared one, which is what the
        map translates. Without a map that moves the schema, ``self`` is returned.
        """
        target = translated_schema(self.schema, translate_map)
        moved_to = () if target == self.schema else (target,)
        return self if moved_to == self.moved_to else replace(self, moved_to=moved_to)

    @property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel on which enqueues wake idle workers."""
        return f"{self.effective_schema or 'public'}.{self.prefix}wakeup"

    @property
    def finished_channel(self) -> str:
        """The channel on which the completion of an awaited job sends the job's id."""
        return f"{self.effective_schema or 'public'}.{self.prefix}finished"


def translated_schema(schema: str | None, translate_map: Mapping[Any, Any] | None) -> str | None:
    """``schema`` as a connection with the ``schema_translate_map`` option names it.

    SQLAlchemy applies the map to the statements it compiles from the tables; SQL written
    by name (the frozen migration DDL, the catalog query) must apply it the same way. A
    schema absent from the map, or no map, is left as it is.
    """
    if not translate_map or schema not in translate_map:
        return schema
    translated = translate_map[schema]
    return None if translated is None else str(translated)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def resolve_schema(metadata: MetaData, schema: str | None) -> str | None:
    """The schema the queue's tables live in: ``schema`` if given, else ``metadata.schema``.

    A table added to ``MetaData(schema="app")`` without a schema of its own goes to ``app``,
    so the queue must record ``app`` too: its migration operation, verification, NOTIFY
    channel and autogenerate comparison all name the schema it records. Giving both, with
    different names, raises :class:`~sqla_queue.errors.InvalidIdentifierError` naming both:
    the queue's tables would leave the metadata's schema, which is rarely what was meant.
    """
    declared = metadata.schema
    if declared is not None:
        try:
            declared = validate_schema(str(declared))
        except InvalidIdentifierError as exc:
            raise InvalidIdentifierError(f"the metadata's schema: {exc}") from None
    if schema is None:
        return declared
    schema = validate_schema(schema)
    if declared is not None and schema != declared:
        raise InvalidIdentifierError(
            f"conflicting schemas for the queue: Queue(schema={schema!r}), but its metadata "
            f"is MetaData(schema={declared!r}). Name the schema once: leave schema= out to "
            f"put the queue in {declared!r}, or pass the same name to both"
        )
    return schema


def _jobs_key(jobs_name: str, partitioned: bool) -> PrimaryKeyConstraint:
    key = PrimaryKeyConstraint("id", name=conv(f"{jobs_name}_pkey"))
    if partitioned:
        # Kept in the model (the ORM maps by it), left out of CREATE TABLE.
        key.ddl_if(callable_=lambda *args, **kw: False)
    return key


def build_tables(
    metadata: MetaData,
    *,
    schema: str | None = None,
    prefix: str = DEFAULT_PREFIX,
    history: str = HistoryLayout.PLAIN,
) -> QueueTables:
    """Create the queue's tables in ``metadata`` and return them.

    The tables go to ``schema``, else to the metadata's own schema (``MetaData(schema=...)``),
    else to the search path; :func:`resolve_schema` decides, and ``QueueTables.schema``
    records the result. Every constraint and index name goes through ``conv()`` so that the
    host's naming convention cannot rename objects that migrations and verification refer to.

    With ``history="partitioned"`` the jobs table is created partitioned by status, its
    partitions with it (:mod:`sqla_queue.history.layout`); the Core table is the same.
    """
    schema = resolve_schema(metadata, schema)
    prefix = validate_prefix(prefix)
    history = check_history(history)
    partitioned = history == HistoryLayout.PARTITIONED
    jobs_name = f"{prefix}jobs"
    exec_name = f"{prefix}job_executions"

    jobs = Table(
        jobs_name,
        metadata,
        Column("id", BigInteger, Identity(always=False), primary_key=True),
        Column("task", Text, nullable=False),
        Column("payload", JSONB, nullable=False),
        Column("priority", Integer, nullable=False, server_default=text("0")),
        Column("queue_id", Text, nullable=True),
        Column("status", Text, nullable=False, server_default=text(f"'{JobStatus.QUEUED}'")),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("max_attempts", Integer, nullable=False),
        Column("errors", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
        Column("result", JSONB, nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        Column("scheduled_at", DateTime(timezone=True), nullable=False),
        Column("finished_at", DateTime(timezone=True), nullable=True),
        # Version 4. The job's unique key, when it was enqueued with one (the key itself
        # is held in the unique_keys table; this copy is for listing and filtering).
        Column("unique_key", Text, nullable=True),
        # Version 4. The application row this job is about: its table's full name and its
        # primary key as text (a JSON array for a composite key). No foreign key: the job
        # keeps its record when the row is deleted.
        Column("about_table", Text, nullable=True),
        Column("about_key", Text, nullable=True),
        # Version 4. Set by a caller waiting for the result: the completion then sends a
        # NOTIFY for this job (and only for such jobs).
        Column("awaited", Boolean, nullable=False, server_default=text("false")),
        CheckConstraint(f"status IN ({_in(JobStatus.ALL)})", name=conv(f"{jobs_name}_status_ck")),
        CheckConstraint("max_attempts >= 1", name=conv(f"{jobs_name}_max_attempts_ck")),
        # Named as PostgreSQL would, and protected from the host's naming convention, so
        # create_all and the migration ops agree on it. A partitioned table cannot have it
        # (its key would have to hold the partition key, and finished_at is nullable): the
        # queued jobs' partition carries its own, and the identity keeps ids unique.
        _jobs_key(jobs_name, partitioned),
        schema=schema,
        comment="sqla_queue: durable record of every job",
        postgresql_partition_by="LIST (status)" if partitioned else None,
    )
    Index(
        conv(f"{jobs_name}_failed_ix"),
        jobs.c.finished_at,
        postgresql_where=jobs.c.status == JobStatus.FAILED,
    )
    Index(
        conv(f"{jobs_name}_finished_ix"),
        jobs.c.finished_at,
        postgresql_where=jobs.c.finished_at.is_not(None),
    )
    # Version 4: "which jobs does this row have?", and listing by unique key. Both cover
    # only the jobs that use the option.
    Index(
        conv(f"{jobs_name}_about_ix"),
        jobs.c.about_table,
        jobs.c.about_key,
        postgresql_where=jobs.c.about_key.is_not(None),
    )
    Index(
        conv(f"{jobs_name}_unique_key_ix"),
        jobs.c.task,
        jobs.c.unique_key,
        postgresql_where=jobs.c.unique_key.is_not(None),
    )

    # An execution's id is its job's id. Version 3 dropped the foreign key that said so:
    # its check ran a cached plan per inserted row, and a plan made while ``jobs`` looked
    # empty scans the whole table, so every enqueue on that connection cost O(jobs) until
    # the next ANALYZE (measured: 12,000 rows in 11 s after an analyze of the empty table,
    # 0.07 s without the key). Executions are only ever written by this library, next to
    # their job; an orphan (its job deleted by hand) is failed and removed when claimed.
    executions = Table(
        exec_name,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("task", Text, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("queue_id", Text, nullable=True),
        Column("state", Text, nullable=False, server_default=text(f"'{ExecutionState.PENDING}'")),
        Column("execute_at", DateTime(timezone=True), nullable=False),
        Column("attempt", Integer, nullable=False, server_default=text("0")),
        Column("reclaims", Integer, nullable=False, server_default=text("0")),
        Column("worker_id", Uuid, nullable=True),
        Column("alive_at", DateTime(timezone=True), nullable=True),
        Column("lease_seconds", Double, nullable=True),
        # The capacity seat (0..limit-1) of an execution of a concurrency-limited task.
        # It is kept while the execution runs and across a reclaim, and cleared when the
        # job goes back to pending for any other reason.
        Column("slot", Integer, nullable=True),
        # Version 4. Someone asked to cancel this execution while it ran: the heartbeat
        # tells its worker, and the completion ends the job cancelled unless it succeeded.
        Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
        CheckConstraint(
            f"state IN ({_in(ExecutionState.ALL)})", name=conv(f"{exec_name}_state_ck")
        ),
        PrimaryKeyConstraint("id", name=conv(f"{exec_name}_pkey")),
        schema=schema,
        comment=schema_version_comment(SCHEMA_VERSION),
    )
    # Claims and heartbeats rewrite rows in place; free space on the page lets
    # PostgreSQL keep the new version on the same page.
    set_storage_parameters(executions, {"fillfactor": "70"})
    pending = executions.c.state == ExecutionState.PENDING
    running = executions.c.state == ExecutionState.RUNNING
    # Heartbeats and the reclaimer only ever look at running rows, which are few.
    Index(conv(f"{exec_name}_running_ix"), executions.c.alive_at, postgresql_where=running)
    # Head-of-queue probe: is there an earlier active row with the same queue_id?
    Index(
        conv(f"{exec_name}_queue_ix"),
        executions.c.queue_id,
        executions.c.execute_at,
        executions.c.id,
        postgresql_where=executions.c.queue_id.is_not(None),
    )
    # The database's own guarantee that one queue_id never runs twice at once.
    Index(
        conv(f"{exec_name}_queue_running_uq"),
        executions.c.queue_id,
        unique=True,
        postgresql_where=running & executions.c.queue_id.is_not(None),
    )
    # The claim walks one (task, priority) slice at a time, in (execute_at, id) order up to
    # the due time: fresh rows, and reclaimed rows that kept their seat. The next due time
    # is the first entry past now() of each slice. Version 3 dropped the indexes over all
    # tasks (claim_ix, due_ix): walked in claim order, they pass every other task's backlog,
    # and they were the plans stale statistics made look cheap.
    Index(
        conv(f"{exec_name}_task_claim_ix"),
        executions.c.task,
        executions.c.priority.desc(),
        executions.c.execute_at,
        executions.c.id,
        postgresql_where=pending & executions.c.slot.is_(None),
    )
    Index(
        conv(f"{exec_name}_seated_ix"),
        executions.c.task,
        executions.c.priority.desc(),
        executions.c.execute_at,
        executions.c.id,
        postgresql_where=pending & executions.c.slot.is_not(None),
    )
    # Keys (schema version 3). The first non-waiting rows of a key, for the claim's
    # "is this the key's head?" probe, which must never pass a key's waiting backlog.
    keyed = executions.c.queue_id.is_not(None)
    Index(
        conv(f"{exec_name}_queue_active_ix"),
        executions.c.queue_id,
        executions.c.execute_at,
        executions.c.id,
        postgresql_where=keyed & (pending | running),
    )
    # A key's waiting jobs in order: the next one to promote is the first entry.
    Index(
        conv(f"{exec_name}_waiting_ix"),
        executions.c.queue_id,
        executions.c.execute_at,
        executions.c.id,
        postgresql_where=executions.c.state == ExecutionState.WAITING,
    )
    # Finished keyed executions left for the sweep (rare, and deleted within seconds).
    Index(
        conv(f"{exec_name}_done_ix"),
        executions.c.queue_id,
        postgresql_where=executions.c.state == ExecutionState.DONE,
    )
    # Capacity slots: two claims of one seat collide here even when neither can see the
    # other's uncommitted row, which a count read from a snapshot never could.
    Index(
        conv(f"{exec_name}_slot_uq"),
        executions.c.task,
        executions.c.slot,
        unique=True,
        postgresql_where=executions.c.slot.is_not(None),
    )

    limits_name = f"{prefix}task_limits"
    limits = Table(
        limits_name,
        metadata,
        Column("task", Text, nullable=False),
        Column("concurrency_limit", Integer, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("task", name=conv(f"{limits_name}_pkey")),
        CheckConstraint("concurrency_limit >= 1", name=conv(f"{limits_name}_limit_ck")),
        schema=schema,
        comment="sqla_queue: concurrency limit per task, shared by every worker",
    )
    keys_name = f"{prefix}unique_keys"
    unique_keys = Table(
        keys_name,
        metadata,
        Column("task", Text, nullable=False),
        Column("key", Text, nullable=False),
        # The job that holds the key. NULL only inside the enqueue that is taking it, which
        # holds the row locked until it commits.
        Column("job_id", BigInteger, nullable=True),
        Column("scope", Text, nullable=False),
        # For scope 'finished': how long after the job finished the key stays held.
        Column("hold_seconds", Double, nullable=True),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("task", "key", name=conv(f"{keys_name}_pkey")),
        CheckConstraint(f"scope IN ({_in(UniqueScope.ALL)})", name=conv(f"{keys_name}_scope_ck")),
        schema=schema,
        comment="sqla_queue: unique job keys, each held by one job while its scope lasts",
    )
    # Version 5: a bounded task's enqueue counts its waiting executions by task (its
    # pending ones are counted in the two claim indexes, whose first column is the task).
    Index(
        conv(f"{exec_name}_task_waiting_ix"),
        executions.c.task,
        postgresql_where=executions.c.state == ExecutionState.WAITING,
    )
    controls_name = f"{prefix}task_controls"
    controls = Table(
        controls_name,
        metadata,
        Column("task", Text, nullable=False),
        Column("paused", Boolean, nullable=False, server_default=text("false")),
        # At most rate_max starts in any window of rate_seconds, across every worker.
        Column("rate_max", Integer, nullable=True),
        Column("rate_seconds", Double, nullable=True),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("task", name=conv(f"{controls_name}_pkey")),
        CheckConstraint(
            "(rate_max IS NULL) = (rate_seconds IS NULL) AND rate_max >= 1 AND rate_seconds > 0",
            name=conv(f"{controls_name}_rate_ck"),
        ),
        schema=schema,
        comment="sqla_queue: pause and rate limit per task, shared by every worker",
    )
    starts_name = f"{prefix}rate_starts"
    rate_starts = Table(
        starts_name,
        metadata,
        Column("task", Text, nullable=False),
        # The database clock when the claim took the start, under the task's control row.
        Column("started_at", DateTime(timezone=True), nullable=False),
        Column("job_id", BigInteger, nullable=False),
        PrimaryKeyConstraint("task", "started_at", "job_id", name=conv(f"{starts_name}_pkey")),
        schema=schema,
        comment="sqla_queue: recent starts of rate-limited tasks",
    )
    schedules_name = f"{prefix}schedules"
    schedules = Table(
        schedules_name,
        metadata,
        Column("name", Text, nullable=False),
        Column("task", Text, nullable=False),
        # The latest tick enqueued (or passed over by the catch-up policy).
        Column("last_tick", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("name", name=conv(f"{schedules_name}_pkey")),
        schema=schema,
        comment="sqla_queue: periodic schedules, each with its last enqueued tick",
    )
    daemons_name = f"{prefix}daemons"
    daemons = Table(
        daemons_name,
        metadata,
        Column("name", Text, nullable=False),
        Column("instance", Integer, nullable=False),
        # The worker running this instance, until lease_until; NULL when nobody does.
        Column("worker_id", Uuid, nullable=True),
        Column("lease_until", DateTime(timezone=True), nullable=True),
        Column("started_at", DateTime(timezone=True), nullable=True),
        Column("restarts", Integer, nullable=False, server_default=text("0")),
        Column("last_error", Text, nullable=True),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("name", "instance", name=conv(f"{daemons_name}_pkey")),
        schema=schema,
        comment="sqla_queue: daemon instances and the worker that runs each",
    )
    workers_name = f"{prefix}workers"
    workers = Table(
        workers_name,
        metadata,
        Column("worker_id", Uuid, nullable=False),
        Column("hostname", Text, nullable=False),
        Column("pid", Integer, nullable=False),
        Column("tasks", ARRAY(Text), nullable=False),
        Column("concurrency", Integer, nullable=False),
        # What the worker ran, as of its last beat: handlers running, jobs finished.
        Column("running", Integer, nullable=False, server_default=text("0")),
        Column("finished", BigInteger, nullable=False, server_default=text("0")),
        Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        # The worker's last beat; a row not seen for a while is stale and expires.
        Column("seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("worker_id", name=conv(f"{workers_name}_pkey")),
        schema=schema,
        comment="sqla_queue: live workers, each refreshed by its own beats",
    )
    tables = QueueTables(
        jobs=jobs,
        executions=executions,
        limits=limits,
        unique_keys=unique_keys,
        controls=controls,
        rate_starts=rate_starts,
        schedules=schedules,
        daemons=daemons,
        workers=workers,
        schema=schema,
        prefix=prefix,
        history=history,
    )
    if partitioned:
        from sqla_queue.history.layout import attach_partition_ddl

        attach_partition_ddl(tables)
    # Tooling (alembic_ext's comparator, verification) finds the queue's tables here
    # without importing the host's Queue object.
    info = {
        "schema_version": SCHEMA_VERSION,
        "prefix": prefix,
        "schema": schema,
        "history": history,
    }
    jobs.info["sqla_queue"] = {**info, "role": "jobs"}
    executions.info["sqla_queue"] = {**info, "role": "executions"}
    limits.info["sqla_queue"] = {**info, "role": "limits"}
    unique_keys.info["sqla_queue"] = {**info, "role": "unique_keys"}
    controls.info["sqla_queue"] = {**info, "role": "controls"}
    rate_starts.info["sqla_queue"] = {**info, "role": "rate_starts"}
    schedules.info["sqla_queue"] = {**info, "role": "schedules"}
    daemons.info["sqla_queue"] = {**info, "role": "daemons"}
    workers.info["sqla_queue"] = {**info, "role": "workers"}
    metadata.info.setdefault("sqla_queue", []).append(tables)
    return tables
