"""The curated mutants of ``nox -s mutants``: each breaks one promise on purpose.

A mutant names a file, a piece of its text that must occur exactly once (so that a mutant
cannot go stale without the session saying so), the text that replaces it, and the tests
that must notice: the integration or acceptance tests that guard the promise, never a SQL
snapshot (those fail on any change of a statement's text, so they prove nothing here).

When a promise lands, add its mutant here; when a statement changes so that a mutant's
text is gone, the session fails until the mutant is rewritten against the new text.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MUTANTS", "Mutant"]


@dataclass(frozen=True)
class Mutant:
    """One breaking change, and the tests that must fail under it."""

    #: Short, unique, used on the command line (``nox -s mutants -- NAME ...``).
    name: str
    #: The promise it breaks, in a line.
    promise: str
    #: The file it changes, relative to the repository's root.
    path: str
    #: Text that occurs exactly once in ``path``.
    old: str
    #: What replaces it.
    new: str
    #: pytest node ids (relative to the root) of the tests that must fail.
    tests: tuple[str, ...]


FENCES = "tests/integration/test_fences.py"
DURABLE_FENCE = f"{FENCES}::test_a_stale_attempts_checkpoint_cursor_and_wait_record_are_refused"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="claim-skip-locked",
        promise="a claim passes rows another open claim holds (FOR UPDATE ... SKIP LOCKED)",
        path="sqla_queue/statements/claim_walks.py",
        old="""        .with_for_update(of=e, skip_locked=True, key_share=True)
        .correlate_except(e)""",
        new="""        .with_for_update(of=e, key_share=True)
        .correlate_except(e)""",
        tests=("tests/integration/test_claim.py::test_two_open_claims_never_share_an_execution",),
    ),
    Mutant(
        name="completion-fence-worker",
        promise="a completion applies only under the worker that holds the execution",
        path="sqla_queue/statements/complete.py",
        old="""        ex.c.attempt == outcome.c.attempt,
        ex.c.worker_id == worker,
""",
        new="""        ex.c.attempt == outcome.c.attempt,
""",
        tests=(
            f"{FENCES}::test_a_stale_completion_is_refused_while_another_worker_runs_the_job_at_its_attempt",
        ),
    ),
    Mutant(
        name="completion-fence-attempt",
        promise="a completion applies only to the attempt that holds the execution",
        path="sqla_queue/statements/complete.py",
        old="""        ex.c.id == outcome.c.id,
        ex.c.attempt == outcome.c.attempt,
""",
        new="""        ex.c.id == outcome.c.id,
""",
        tests=(f"{FENCES}::test_a_stale_completion_of_the_same_worker_is_refused_by_its_attempt",),
    ),
    Mutant(
        name="completion-fence-whole",
        promise="a late completion never overwrites the run that holds the row now",
        path="sqla_queue/statements/complete.py",
        old="""        ex.c.attempt == outcome.c.attempt,
        ex.c.worker_id == worker,
""",
        new="",
        tests=(
            f"{FENCES}::test_late_completion_is_fenced_off_while_the_new_attempt_holds_the_row",
        ),
    ),
    Mutant(
        name="heartbeat-fence-worker",
        promise="a heartbeat renews only executions its own worker holds",
        path="sqla_queue/statements/liveness.py",
        old="""    fence = (
        ex.c.worker_id == worker,
        still_running(ex.c.state),""",
        new="""    fence = (
        still_running(ex.c.state),""",
        tests=(f"{FENCES}::test_a_stale_heartbeat_neither_renews_nor_keeps_another_workers_run",),
    ),
    Mutant(
        name="heartbeat-fence-attempt",
        promise="a heartbeat renews only the attempt that holds the execution",
        path="sqla_queue/statements/liveness.py",
        old="        tuple_(ex.c.id, ex.c.attempt).in_(held),",
        new='        ex.c.id.in_(select(func.unnest(bindparam("ids", type_=ARRAY(BigInteger))))),',
        tests=(
            "tests/integration/test_liveness.py::test_heartbeat_of_a_reclaimed_execution_changes_nothing",
        ),
    ),
    Mutant(
        name="checkpoint-fence-attempt",
        promise="a durable step, cursor or wait commits only under the attempt holding the job",
        path="sqla_queue/statements/durable.py",
        old="""        ex.c.attempt == bindparam("held_attempt", type_=Integer),
        still_running(ex.c.state),""",
        new="""        still_running(ex.c.state),""",
        tests=(f"{DURABLE_FENCE}[older attempt]",),
    ),
    Mutant(
        name="checkpoint-fence-worker",
        promise="a durable step, cursor or wait commits only under the worker holding the job",
        path="sqla_queue/statements/durable.py",
        old="""        still_running(ex.c.state),
        ex.c.worker_id == bindparam("worker", type_=Uuid),""",
        new="""        still_running(ex.c.state),""",
        tests=(f"{DURABLE_FENCE}[other worker]",),
    ),
    Mutant(
        name="seat-range",
        promise="a limited task's seats are 0 .. limit-1: never more running than its limit",
        path="sqla_queue/statements/claim_limits.py",
        old="(func.generate_series(0, room.c.lim - room.c.legacy - 1) + offset) % usable",
        new="(func.generate_series(0, room.c.lim - room.c.legacy) + offset) % (usable + 1)",
        tests=(
            "tests/integration/test_limits.py::test_limit_one_never_admits_a_second_run",
            "tests/integration/test_limits.py::test_seat_search_wraps_around_from_its_offset",
        ),
    ),
    Mutant(
        name="key-head-of-line",
        promise="of a key's pending jobs, only the first in (execute_at, id) order is claimed",
        path="sqla_queue/statements/claim_walks.py",
        old="""    comes_first = and_(
        ~exists().where(
            p.c.queue_id == row.c.queue_id,
            or_(p.c.state == PENDING, p.c.state == RUNNING),
            tuple_(p.c.execute_at, p.c.id) < tuple_(row.c.execute_at, row.c.id),
        ),
        ~waiting_before(tables, row),""",
        new="""    comes_first = and_(
        ~waiting_before(tables, row),""",
        tests=(f"{FENCES}::test_two_raced_keyed_enqueues_are_claimed_one_at_a_time",),
    ),
    Mutant(
        name="key-nothing-running",
        promise="no job of a key is claimed while a job of the key runs (an old release's too)",
        path="sqla_queue/statements/claim_walks.py",
        old="""            ~exists().where(r.c.queue_id == row.c.queue_id, r.c.state == RUNNING),
""",
        new="",
        tests=(f"{FENCES}::test_a_job_due_before_a_running_row_of_an_old_release_waits_for_it",),
    ),
    Mutant(
        name="release-on-last-parent",
        promise="the transaction ending a node's last parent releases it (none is stranded)",
        path="sqla_queue/statements/release.py",
        # The parent that finds no other open (the last) no longer takes the node to its
        # decision; only those that are not the last do, and find it still waiting.
        old="or_(must_count, pending_other.is_(None)),",
        new="or_(must_count, pending_other.is_not(None)),",
        tests=(
            "tests/integration/test_workflows.py::test_chord_gathers_every_result",
            "tests/integration/test_workflow_races.py"
            "::test_last_two_parents_at_once_release_the_callback_exactly_once",
        ),
    ),
    Mutant(
        name="unique-key-held",
        promise="a unique key stays held while its job is queued",
        path="sqla_queue/statements/unique.py",
        old="""        and_(~queued_scope, jobs.c.status == QUEUED),
""",
        new="",
        tests=(
            "tests/integration/test_unique_jobs.py::test_scope_active_is_held_until_the_job_finishes",
        ),
    ),
    Mutant(
        name="reclaim-comparison",
        promise="only an execution whose heartbeat is older than its lease is reclaimed",
        path="sqla_queue/statements/liveness.py",
        old="            ex.c.alive_at < lease_start,",
        new="            ex.c.alive_at > lease_start,",
        tests=(
            "tests/integration/test_liveness.py::test_a_dead_workers_execution_is_reclaimed_and_run_again",
            "tests/integration/test_liveness.py::test_fresh_heartbeat_is_not_reclaimed",
        ),
    ),
    Mutant(
        name="enqueue-notify",
        promise="a committed enqueue wakes the workers (one NOTIFY per transaction)",
        path="sqla_queue/statements/enqueue.py",
        old="""    if not notify:
        return ids
    wake = select(""",
        new="""    if True:
        return ids
    wake = select(""",
        tests=(
            "tests/integration/test_enqueue.py::test_one_notification_per_committed_transaction",
        ),
    ),
    Mutant(
        name="rate-window",
        promise="a rate-limited task starts at most rate_max jobs in any window of its length",
        path="sqla_queue/statements/claim_limits.py",
        old="    window_start = now.c.at - seconds(control.c.rate_seconds)",
        new="    window_start = now.c.at",
        tests=(
            "tests/integration/test_pause_and_rate.py::test_a_rate_limit_spreads_starts_and_no_window_holds_more",
        ),
    ),
    Mutant(
        name="cancel-running",
        promise="a cancel of a running job asks its worker to stop it",
        path="sqla_queue/statements/lifecycle.py",
        old="""        .where(ex.c.id == target.c.id, target.c.state == RUNNING)
        .values(cancel_requested=true())""",
        new="""        .where(ex.c.id == target.c.id, target.c.state == RUNNING)
        .values(cancel_requested=ex.c.cancel_requested)""",
        tests=(
            "tests/integration/test_cancel.py::test_a_cancel_waits_for_an_open_claim_and_then_asks_the_job_to_stop",
        ),
    ),
)
