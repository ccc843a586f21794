"""One builder per table of a queue: its columns, constraints, indexes and comment.

Each builder adds one table to the host's ``metadata`` under ``prefix`` in ``schema`` and
returns it; :func:`~sqla_queue.models.tables.build_tables` composes them. Every constraint
and index name goes through ``conv()`` so that the host's naming convention cannot rename
objects that migrations and verification refer to.

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
    literal,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import conv

from sqla_queue.models._storage import set_storage_parameters
from sqla_queue.models.vocabulary import (
    SCHEMA_VERSION,
    ExecutionState,
    JobStatus,
    NodeState,
    ParentFailure,
    ParentPolicy,
    UniqueScope,
    schema_version_comment,
)

__all__ = [
    "controls_table",
    "daemons_table",
    "executions_table",
    "jobs_table",
    "limits_table",
    "rate_starts_table",
    "schedules_table",
    "unique_keys_table",
    "workers_table",
    "workflow_edges_table",
    "workflow_nodes_table",
    "workflows_table",
]


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _jobs_key(jobs_name: str, partitioned: bool) -> PrimaryKeyConstraint:
    key = PrimaryKeyConstraint("id", name=conv(f"{jobs_name}_pkey"))
    if partitioned:
        # Kept in the model (the ORM maps by it), left out of CREATE TABLE.
        key.ddl_if(callable_=lambda *args, **kw: False)
    return key


def jobs_table(
    metadata: MetaData, schema: str | None, prefix: str, *, partitioned: bool = False
) -> Table:
    """The durable record of every job, partitioned by status when ``partitioned``.

    A partitioned jobs table gets the same Core table; ``create_all`` creates its
    partitions only when :func:`~sqla_queue.models.partitioning.attach_partition_ddl`
    is attached to it.
    """
    jobs_name = f"{prefix}jobs"
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
    return jobs


def executions_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The live executions: one row per pending, running or waiting job."""
    exec_name = f"{prefix}job_executions"
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
        # Version 6. The job is a workflow's node: its completion also releases its
        # dependents. The claim returns it, so a batch without nodes pays nothing.
        Column("workflow", Boolean, nullable=False, server_default=text("false")),
        # Version 7. What a suspended durable job waits for ("sleep", "signal:<name>",
        # "row:<condition>:<key>", "version:<step>"); its execute_at is until when.
        Column("wait", Text, nullable=True),
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
    # Version 7: suspended durable jobs, outside every index above but the slot's (they
    # hold no seat). The wake sweep walks them by due time; a signal finds its job by id,
    # and a condition's flush finds the jobs waiting on a row by what they wait for.
    suspended = executions.c.state == ExecutionState.SUSPENDED
    Index(conv(f"{exec_name}_suspended_ix"), executions.c.execute_at, postgresql_where=suspended)
    Index(conv(f"{exec_name}_wait_ix"), executions.c.wait, postgresql_where=suspended)
    # Version 5: a bounded task's enqueue counts its waiting executions by task (its
    # pending ones are counted in the two claim indexes, whose first column is the task).
    Index(
        conv(f"{exec_name}_task_waiting_ix"),
        executions.c.task,
        postgresql_where=executions.c.state == ExecutionState.WAITING,
    )
    return executions


def limits_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The concurrency limits stored at run time."""
    limits_name = f"{prefix}task_limits"
    return Table(
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


def unique_keys_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The unique job keys, one row per key."""
    keys_name = f"{prefix}unique_keys"
    return Table(
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


def controls_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The pause flag and rate limit of each task, stored at run time."""
    controls_name = f"{prefix}task_controls"
    return Table(
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


def rate_starts_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The recent starts of rate-limited tasks, by the database clock."""
    starts_name = f"{prefix}rate_starts"
    return Table(
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


def schedules_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """Each periodic schedule's last enqueued tick."""
    schedules_name = f"{prefix}schedules"
    return Table(
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


def daemons_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """Each daemon instance's current owner and lease."""
    daemons_name = f"{prefix}daemons"
    return Table(
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


def workers_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The live workers, each refreshed by its own beats."""
    workers_name = f"{prefix}workers"
    return Table(
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


def workflows_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The workflows: one row per graph of jobs enqueued together (schema version 6)."""
    name = f"{prefix}workflows"
    workflows = Table(
        name,
        metadata,
        Column("id", BigInteger, Identity(always=False), primary_key=True),
        Column("name", Text, nullable=False),
        # The application row the workflow is about, as for jobs (see sqla_queue.links).
        Column("about_table", Text, nullable=True),
        Column("about_key", Text, nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        # Set by cancel_workflow; the nodes it found undecided are cancelled with it.
        Column("cancelled_at", DateTime(timezone=True), nullable=True),
        PrimaryKeyConstraint("id", name=conv(f"{name}_pkey")),
        schema=schema,
        comment="sqla_queue: workflows, each a graph of jobs enqueued together",
    )
    # "Which workflows does this row have?", and the unique workflow's check.
    Index(
        conv(f"{name}_about_ix"),
        workflows.c.about_table,
        workflows.c.about_key,
        workflows.c.name,
        postgresql_where=workflows.c.about_key.is_not(None),
    )
    return workflows


def workflow_nodes_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """The jobs of each workflow, and what each needs of its parents (schema version 6)."""
    name = f"{prefix}workflow_nodes"
    nodes = Table(
        name,
        metadata,
        # The node's job. No foreign key, as for executions: written only by this library.
        Column("job_id", BigInteger, nullable=False, autoincrement=False),
        Column("workflow_id", BigInteger, nullable=False),
        Column("name", Text, nullable=False),
        # How many parents the node has: a node with one needs no lock to be released.
        Column("parents", Integer, nullable=False),
        Column(
            "policy", Text, nullable=False, server_default=text(f"'{ParentPolicy.ALL_SUCCEEDED}'")
        ),
        Column("quorum", Integer, nullable=True),
        Column(
            "on_parent_failure",
            Text,
            nullable=False,
            server_default=text(f"'{ParentFailure.CANCEL}'"),
        ),
        Column("state", Text, nullable=False),
        # When released: run this long after, or at this time (else at once).
        Column("delay", Double, nullable=True),
        Column("run_at", DateTime(timezone=True), nullable=True),
        PrimaryKeyConstraint("job_id", name=conv(f"{name}_pkey")),
        CheckConstraint(f"state IN ({_in(NodeState.ALL)})", name=conv(f"{name}_state_ck")),
        CheckConstraint(f"policy IN ({_in(ParentPolicy.ALL)})", name=conv(f"{name}_policy_ck")),
        CheckConstraint(
            f"on_parent_failure IN ({_in(ParentFailure.ALL)})",
            name=conv(f"{name}_failure_ck"),
        ),
        CheckConstraint(
            f"(policy = '{ParentPolicy.QUORUM}') = (quorum IS NOT NULL) "
            "AND quorum BETWEEN 1 AND parents",
            name=conv(f"{name}_quorum_ck"),
        ),
        schema=schema,
        comment="sqla_queue: the jobs of each workflow and what each needs of its parents",
    )
    # A node's name is unique in its workflow; the workflow's nodes are its entries.
    Index(conv(f"{name}_name_uq"), nodes.c.workflow_id, nodes.c.name, unique=True)
    return nodes


def workflow_edges_table(metadata: MetaData, schema: str | None, prefix: str) -> Table:
    """Each dependency of a workflow, with its parent's outcome once known (version 6)."""
    name = f"{prefix}workflow_edges"
    edges = Table(
        name,
        metadata,
        Column("child_id", BigInteger, nullable=False),
        Column("parent_id", BigInteger, nullable=False),
        # NULL while the parent has not ended; then its final status, and its result (or
        # its last error) for the child to read: kept here, a parent's row may be pruned.
        Column("outcome", Text, nullable=True),
        Column("result", JSONB, nullable=True),
        PrimaryKeyConstraint("child_id", "parent_id", name=conv(f"{name}_pkey")),
        CheckConstraint(
            f"outcome IN ({_in(JobStatus.FINAL)})",
            name=conv(f"{name}_outcome_ck"),
        ),
        schema=schema,
        comment="sqla_queue: workflow dependencies, each with its parent's outcome",
    )
    # A finished job's dependents: what its completion releases.
    Index(conv(f"{name}_parent_ix"), edges.c.parent_id)
    # A child's parents that have not ended: the release's "am I the last?" probe.
    Index(
        conv(f"{name}_open_ix"),
        edges.c.child_id,
        edges.c.parent_id,
        postgresql_where=edges.c.outcome.is_(None),
    )
    # A child's parents that failed or were cancelled: the decision's "did one fail?"
    # probe, one entry away instead of a walk of every parent of a large fan-in.
    Index(
        conv(f"{name}_failed_ix"),
        edges.c.child_id,
        # Not NULL and not succeeded: failed or cancelled (the outcome's check).
        postgresql_where=edges.c.outcome.op("<>")(literal(JobStatus.SUCCEEDED)),
    )
    return edges
